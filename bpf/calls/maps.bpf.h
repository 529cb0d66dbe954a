/* Every map of calls.bpf.c, by concern. The agent reads and writes them by these names
 * (otel_eacgm/bpf_program.py), so a name here is part of its interface. Maps can be declared in
 * a header; operating on them (`inflight.lookup(&k)`) works only in calls.bpf.c itself, which
 * is why the headers reach them through its accessors.
 */
#ifndef EACGM_CALLS_MAPS_BPF_H
#define EACGM_CALLS_MAPS_BPF_H

/* Out to the agent: every record of ../events.h, and the self-telemetry counters. */
BPF_RINGBUF_OUTPUT(events, EACGM_RINGBUF_PAGES);
BPF_ARRAY(stats, __u64, STAT_COUNT);

/* Written by the agent: each catalog row's settings by probe slot, the Python interpreters'
 * USDT argument registers, and which calls become spans. */
BPF_ARRAY(probe_conf, struct probe_conf, EACGM_PROBE_SLOTS);
BPF_ARRAY(py_conf, struct probe_conf, 1); /* usdt_reg of the interpreters' function probes */
BPF_ARRAY(sample_conf, struct sample_conf, 1);
/* 1 while the guardrail has cyclable entries detached and their returns may still fire; 2
 * while the pause cycle has every probe in that state. */
BPF_ARRAY(cycle_gap, __u32, 1);

/* Process targets (EACGM_FILTER_PIDS): the agent adds tgids, forks add children, exits remove. */
BPF_HASH(targets, __u32, __u8, 65536);
/* EACGM_HOLD_FORKS: children of a traced process, to be stopped when they return from the fork. */
BPF_HASH(fork_holds, __u32, __u8, 4096);
/* 1 once the agent is ending: nothing is stopped any more (gated opens, held forks), since no one would continue it. */
BPF_ARRAY(holds_off, __u32, 1);
/* Processes stopped for the agent (gated opens, held forks), written before the stop, deleted by
 * the agent when it lets one go: if the agent dies first, its hold guard continues those left
 * (otel_eacgm/hold_guard.py). */
BPF_HASH(held, __u32, __u8, 4096);

/* Open calls: each thread's stack depth and its frames; call ids count up from 1. */
BPF_ARRAY(next_id, __u64, 1);
BPF_HASH(depths, __u32, __u32, 16384);
BPF_HASH(inflight, struct frame_key, struct frame, 65536);

/* Sampling: spans each thread sent in its current time slice. */
BPF_TABLE("lru_hash", __u32, struct slice_count, slice_counts, 16384);

/* Call statistics, kept for every call; stat_zero is a zeroed value to insert (too large for
 * the stack). */
BPF_HASH(call_stats, struct stat_key, struct call_stat, EACGM_STAT_KEYS);
BPF_PERCPU_ARRAY(stat_zero, struct call_stat, 1);

/* Python functions: the agent's rules; FNV-1a hash of a path component named by some rule ->
 * the rule bits (py_rule.need) it sets; per-CPU room for the names being matched. */
BPF_ARRAY(py_rules, struct py_rule, EACGM_PY_RULES);
BPF_HASH(py_names, __u32, __u64, EACGM_PY_NAMES);
BPF_PERCPU_ARRAY(py_scratch, struct py_scratch, 1);

/* Python frame walking (pystack.bpf.h): each traced Python process' layout, written by the
 * agent; each thread's PyThreadState once found (checked against the thread at every use);
 * per-CPU room for the frame being read. */
BPF_HASH(py_layouts, __u32, struct py_layout, 4096);
BPF_TABLE("lru_hash", __u32, __u64, py_tstates, 16384);
BPF_PERCPU_ARRAY(py_frame_buf, struct py_frame_buf, 1);

/* Library opens: the file name from openat's entry to its exit, per thread; per-CPU room to
 * read it into. */
BPF_HASH(opening, __u32, struct open_path, 1024);
BPF_PERCPU_ARRAY(scratch, struct open_path, 1);

/* Tail calls: the common programs (filled by the agent) and their per-CPU argument. */
BPF_PROG_ARRAY(tails, TAIL_COUNT);
BPF_PERCPU_ARRAY(slot_arg, struct slot_call, 1);

#endif
