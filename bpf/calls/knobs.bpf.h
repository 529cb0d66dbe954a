/* Compile-time knobs of calls.bpf.c. They arrive as -D flags from otel_eacgm/bpf_program.py
 * (ProgramOptions.cflags), never by editing the C text; the defaults below are for a bare
 * compile. Run-time settings (which calls become spans, per-probe settings, Python rules) are
 * written by the agent into config maps instead (maps.bpf.h: probe_conf, sample_conf, ...).
 *
 *   EACGM_PROBE_SLOTS    number of entry_N/return_N pairs compiled (multiple of 10, <= 320)
 *   EACGM_RINGBUF_PAGES  ring buffer size in pages (power of two)
 *   EACGM_AGENT_PID      never trace the agent itself
 *   EACGM_STAT_KEYS      call_stats entries (processes x probes x outcomes x keys)
 *   EACGM_FILTER_PIDS    trace only tgids present in `targets` (else every process)
 *   EACGM_FOLLOW_FORKS   children of a traced process are traced too (with EACGM_FILTER_PIDS)
 *   EACGM_GATE_OPENS     stop a traced process that opened a watched library until the agent
 *                        has attached to it (the agent sends SIGCONT)
 *   EACGM_HOLD_FORKS     stop a traced process's new child (a fork, not a thread or vfork) as it
 *                        returns from the fork, before its first instruction, until the agent
 *                        has linked its probes (probes scoped to processes; SIGCONT)
 *   EACGM_CGROUP_ID, EACGM_CGROUP_LEVEL  with EACGM_FILTER_PIDS and --cgroup (v2): a process of
 *                        that cgroup (id, at that depth of the hierarchy) or a descendant that is
 *                        no target yet becomes one when it opens a watched library (a new member)
 */
#ifndef EACGM_CALLS_KNOBS_BPF_H
#define EACGM_CALLS_KNOBS_BPF_H

#ifndef EACGM_PROBE_SLOTS
#define EACGM_PROBE_SLOTS 320
#endif
#ifndef EACGM_RINGBUF_PAGES
#define EACGM_RINGBUF_PAGES 256
#endif
#ifndef EACGM_AGENT_PID
#define EACGM_AGENT_PID 0
#endif
#ifndef EACGM_STAT_KEYS
#define EACGM_STAT_KEYS 8192
#endif

#endif
