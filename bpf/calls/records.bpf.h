/* Records the BPF side keeps for itself (map keys and values the agent does not decode as
 * events; those are in ../events.h). The two enums are indexes the agent uses too: keep
 * eacgm_stat in step with otel_eacgm/events.py (Stat) and eacgm_tail with
 * otel_eacgm/bpf_program.py (Tail) and otel_eacgm/uprobe_multi.py (cookies).
 */
#ifndef EACGM_CALLS_RECORDS_BPF_H
#define EACGM_CALLS_RECORDS_BPF_H

/* Counters read by the agent's self-telemetry (the `stats` array). */
enum eacgm_stat {
	STAT_RINGBUF_DROPS = 0,   /* event lost: ring buffer full */
	STAT_DEPTH_OVERFLOW = 1,  /* call nested deeper than EACGM_MAX_DEPTH: not recorded */
	STAT_UNMATCHED_RETURN = 2,/* return without a recorded entry (probe attached mid-call) */
	STAT_MISMATCHED_RETURN = 3,/* return of another probe than the open frame's */
	STAT_INFLIGHT_FULL = 4,   /* inflight map full */
	STAT_SAMPLED_OUT = 5,     /* call not sent: outside the span sample, fast, succeeded */
	STAT_STATS_FULL = 6,      /* call_stats map full: the call is missing from the statistics */
	STAT_CYCLED_RETURN = 7,   /* return of a call entered while the guardrail had its entry detached */
	STAT_COUNT = 8,
};

/* The common programs in `tails`: a probe's program stores its slot and tail-calls one. */
enum eacgm_tail {
	TAIL_ENTRY = 0, TAIL_RETURN = 1, TAIL_UNWIND = 2, TAIL_PY_ENTRY = 3, TAIL_PY_RETURN = 4,
	TAIL_COUNT = 5,
};

/* The argument of a tail-called program (a tail call keeps the CPU: a per-CPU cell carries it). */
struct slot_call {
	__u32 slot;
	__u32 cont; /* the program `unwind` continues with */
};

/* An open call is found by its thread and its depth on that thread's stack. */
struct frame_key {
	__u32 tid;
	__u32 depth;
};

/* An open call: what the entry saw, kept until its return. */
struct frame {
	__u64 call_id;
	__u64 parent_id;
	__u64 root_id;
	__u64 entry_ns;
	__u32 probe_id;
	__u32 flags;
	__u64 sp;           /* stack pointer at entry (the return address' slot) */
	__u32 exit_probes;  /* returns come from probes at return instructions */
	__u32 repeats;      /* Python: the same function entered again on this frame (see on_entry) */
	__u64 args[EACGM_MAX_ARGS];
	__u8 deref[EACGM_DEREF_BYTES];
};

/* Spans a thread sent in its current sampled slice (sample_conf.slice_max). */
struct slice_count {
	__u64 slice;
	__u64 sent;
};

/* A Python function's names, read once per call to match the rules (too large for the stack). */
struct py_scratch {
	char func[EACGM_FUNC_BYTES];
	char file[EACGM_PATH_BYTES];
};

/* One Python frame's first bytes, read at once (pystack.bpf.h); fields are picked at the
 * layout's offsets, which are masked to stay inside. */
struct py_frame_buf {
	__u8 b[128];
};

/* A file name passed to openat, kept from the syscall's entry to its exit. */
struct open_path {
	char path[EACGM_PATH_BYTES];
};

#endif
