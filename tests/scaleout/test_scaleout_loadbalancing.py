"""The detector scaled out behind the Collector's loadbalancing exporter, through real processes.

Simulated agents of 12 entities on 6 hosts, with a fault in two, send OTLP to a gateway Collector
(collector-config/gateway-loadbalancing.yaml: loadbalancing, static resolver, routing key
`attributes` = the detector's entity attributes) in front of `detector serve` replicas, whose
output goes through a second Collector to the tests' store. docs/scale-out.md states what these
tests show.
"""

from __future__ import annotations

import time
from collections import defaultdict

from e2e_stack import wait_until
from scaleout_stack import FAULTY, HOSTS, WINDOWS, scaleout
from eacgm_testkit.recording import SEC, T0

FAULT_WINDOWS = {("node1", "1003"): range(60, 65), ("node4", "1008"): range(75, 80)}
#: The replica-kill run sends 70 windows more than the reference runs, so that a replica
#: restarted late (on a loaded machine) still warms up and scores again before the end.
KILL_RUN_WINDOWS = WINDOWS + 70


def by_entity(scored: dict) -> dict[tuple[str, str], set[str]]:
    """Entity -> the replicas that scored its windows."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for (host, pid, _), s in scored.items():
        out[(host, pid)].add(s.replica)
    return out


def test_three_replicas_flag_what_one_replica_flags(one_replica, three_replicas) -> None:
    (one, one_anomalies), (three, three_anomalies) = one_replica, three_replicas
    entities = {(f"node{h}", str(1000 + r)) for h, ranks in enumerate(HOSTS) for r in ranks}
    assert set(by_entity(one)) == entities
    # Every window of every entity was scored once, after the 40-window warm-up.
    assert len(one) == len(entities) * (WINDOWS - 40)
    assert {k: s.score for k, s in three.items()} == {k: s.score for k, s in one.items()}
    assert three_anomalies == one_anomalies
    owners = by_entity(three)
    assert all(len(replicas) == 1 for replicas in owners.values()), owners
    assert {r for replicas in owners.values() for r in replicas} == {"replica-0", "replica-1", "replica-2"}
    # Not vacuous: both injected faults are flagged, inside their windows.
    for ent, windows in FAULT_WINDOWS.items():
        flagged = {(s - T0) // SEC for h, p, s in one_anomalies if (h, p) == ent}
        assert flagged & set(windows), (ent, sorted(flagged))
    assert FAULTY <= {(h, p) for h, p, _ in one_anomalies}


def test_a_killed_replica_loses_its_entities_state_and_the_batches_retries_gave_up(one_replica, tmp_path) -> None:
    """Replica 0 is killed (SIGKILL) once it has scored a window, and restarted on its port once
    the gateway has given up on a batch for it. The static resolver keeps it in the ring: its
    entities are never re-routed; their batches are retried (1 s each here), then dropped and
    logged; the restarted replica gets its entities' data again and starts them over (a new
    warm-up). The other replicas' entities are untouched."""
    reference, _ = one_replica
    marks: dict[str, float] = {}
    with scaleout(tmp_path, 3, retry_max_elapsed="1s") as stack:
        def scored_by(replica: str) -> bool:
            return any(p["name"] == "eacgm.anomaly.score" and p["resource"].get("service.instance.id") == replica
                       for p in stack.store.metric_points())

        def outage() -> None:
            wait_until(lambda: scored_by("replica-0"), 120, "replica-0 to score a window")
            stack.replicas[0].proc.kill()
            stack.replicas[0].proc.wait()
            marks["killed"] = time.monotonic()
            wait_until(lambda: stack.dropped()["traces"] > 0, 120,
                       "the gateway to give up on a batch of spans for the dead replica")
            marks["failed"] = time.monotonic()
            stack.start_replica(0, "replica-0-restarted")

        stack.run_agents(KILL_RUN_WINDOWS, pace_s=0.1, during=outage)
        stack.flush()
        dropped = stack.dropped()
        failed_spans = stack.counter("otelcol_exporter_send_failed_spans")
        sent_spans = stack.counter("otelcol_exporter_sent_spans")
        outcomes = stack.outcomes()
        scored = stack.scored()
    owners = by_entity(scored)
    killed = {ent for ent, replicas in owners.items() if replicas & {"replica-0", "replica-0-restarted"}}
    assert killed, "replica 0 owned no entity"
    # No re-routing: the dead replica's entities were scored by it (before and after) only.
    assert all(owners[ent] <= {"replica-0", "replica-0-restarted"} for ent in killed), owners
    # Counted in the gateway's log only: the loadbalancing exporter hands each batch to its
    # replica's queue, which succeeds (its own counters and backend outcomes say "sent"); the
    # replica's exporter then retries it and drops it, logging the items, when retries run out.
    assert dropped["traces"] > 0 and dropped["metrics"] > 0
    assert failed_spans == 0 and sent_spans == stack.sent["spans"]
    assert outcomes["false"] == 0 and outcomes["true"] > 0
    # The other replicas' entities: every window of the reference run scored as by one replica
    # (the windows after it are the longer run's own).
    others = {k: s.score for k, s in reference.items() if k[:2] not in killed}
    assert {k: s.score for k, s in scored.items() if k[:2] not in killed and k[2] < T0 + WINDOWS * SEC} == others
    before = {k: s.score for k, s in scored.items() if s.replica == "replica-0"}
    after = {k: s for k, s in scored.items() if s.replica == "replica-0-restarted"}
    # Before the kill, replica 0 scored as one replica does; then windows were lost ...
    assert before and all(reference[k].score == v for k, v in before.items())
    assert all(k[2] < T0 + WINDOWS * SEC for k in before), "killed after the reference run's windows"
    lost = {k for k in reference if k[:2] in killed} - set(before) - set(after)
    assert lost
    # ... and after its restart it scored its entities again, each after a warm-up of its own.
    assert after, "the restarted replica scored nothing"
    for ent in killed:
        starts_before = [k[2] for k in before if k[:2] == ent]
        starts_after = sorted(k[2] for k in after if k[:2] == ent)
        assert starts_after and (not starts_before or starts_after[0] > max(starts_before) + 40 * SEC)
    print(f"\nreplica-kill: entities of replica 0: {sorted(killed)}; windows scored before the kill "
          f"{len(before)}, lost {len(lost)}, scored after the restart {len(after)}; gateway spans sent "
          f"{sent_spans:.0f} of {stack.sent['spans']}, dropped after retries (gateway log) {dropped}; "
          f"first drop {marks['failed'] - marks['killed']:.1f} s after the kill")
