/* Event records shared by the BPF programs (calls.bpf.c) and the agent (otel_eacgm/events.py).
 * The only header both sides read: structs and constants, nothing else. Every ring-buffer
 * record starts with a type byte and every struct has explicit padding, so that its layout is
 * the same for clang -target bpf and for x86-64 ctypes; tests/test_events_layout.py checks
 * the sizes (the rules: bpf/README.md).
 */
#ifndef EACGM_EVENTS_H
#define EACGM_EVENTS_H

#define EACGM_MAX_ARGS 10   /* 6 register arguments + 4 stack slots (x86-64 SysV) */
#define EACGM_DEREF_BYTES 40 /* cudaLaunchConfig_t / CUlaunchConfig up to the stream field */
#define EACGM_STR_BYTES 256  /* kernel names are long mangled C++ names */
#define EACGM_PATH_BYTES 256
#define EACGM_MAX_DEPTH 32   /* traced calls nested on one thread, all layers together */
#define EACGM_FUNC_BYTES 96  /* Python function names (co_name) */
#define EACGM_PY_RULES 16    /* Python include/exclude rules, first match wins */
#define EACGM_PY_NAMES 64    /* distinct path component names in all rules (bits of py_rule.need) */
#define EACGM_PY_PROBE_ID 65535 /* call_event.probe_id of Python function calls */
#define EACGM_DUR_BUCKETS 32 /* call_stat.dur: [0, 2^10 ns), [2^10, 2^11) .. [2^40 ns, inf) */
#define EACGM_DUR_SHIFT 9
#define EACGM_BW_BUCKETS 32  /* call_stat.bw: [0, 2^20 B/s), [2^20, 2^21) .. [2^50, inf) */
#define EACGM_BW_SHIFT 19
#define EACGM_STATUS_UNWOUND (-2147483647 - 1) /* stat_key.status of calls a C++ exception left */
#define EACGM_PY_FRAMES 64   /* Python frames one py_stack_event holds (the walk's most) */
#define EACGM_PY_NONE 65535  /* py_layout: an offset the interpreter does not have */

enum eacgm_event_type {
	EACGM_EVENT_CALL = 1,      /* struct call_event */
	EACGM_EVENT_CALL_STR = 2,  /* struct call_str_event */
	EACGM_EVENT_LIB_OPEN = 3,  /* struct lib_open_event */
	EACGM_EVENT_THREAD_EXIT = 4, /* struct thread_exit_event */
	EACGM_EVENT_PY_CALL = 5,   /* struct py_call_event */
	EACGM_EVENT_EXEC = 6,      /* struct exec_event */
	EACGM_EVENT_PY_STACK = 7,  /* struct py_stack_event */
	EACGM_EVENT_FORK_HELD = 8, /* struct exec_event: a new child, stopped until its probes are linked */
};


enum eacgm_call_flags {
	EACGM_FLAG_RETURNED = 1,   /* exit_ns and ret are real (uprobe + uretprobe) */
	EACGM_FLAG_INCOMPLETE = 2, /* the thread exited before the call returned (set by the agent) */
	EACGM_FLAG_DEREF = 4,      /* deref holds the struct an argument pointed to */
	EACGM_FLAG_OUT = 8,        /* out_value holds *args[out_arg] read at return */
	EACGM_FLAG_UNWOUND = 16,   /* left by a C++ exception: a later call found its frame gone */
	EACGM_FLAG_SAMPLED = 32,   /* in the span sample; otherwise sent only because it is slow, failed,
				    * an ancestor of a sent call, or feeds the agent's decoders */
	EACGM_FLAG_KEEP = 64,      /* (frames only) a call under this one was sent: send this one too */
};

struct call_event {
	__u8 type;
	__u8 flags;
	__u16 probe_id;     /* row of the agent's probe catalog */
	__u32 pid;          /* tgid */
	__u32 tid;
	__u32 cpu;
	__u32 depth;        /* traced calls open on this thread below this one */
	__u32 pad0;
	__u64 call_id;      /* unique for the agent's lifetime, never 0 */
	__u64 parent_id;    /* 0 when the call is outermost on its thread */
	__u64 root_id;      /* call_id of the outermost open call on the thread */
	__u64 entry_ns;     /* CLOCK_MONOTONIC */
	__u64 exit_ns;      /* == entry_ns for entry-only probes */
	__s64 ret;
	__u64 out_value;
	__u64 args[EACGM_MAX_ARGS];
	__u8 deref[EACGM_DEREF_BYTES];
};

struct call_str_event {
	struct call_event call;
	char str[EACGM_STR_BYTES]; /* the probe's string argument, NUL-terminated */
};

/* A Python function call (USDT function__entry .. function__return). call.args[0] and [1] are
 * the addresses of the file and function name strings, call.args[2] the line number. */
struct py_call_event {
	struct call_event call;
	char func[EACGM_FUNC_BYTES];
	char file[EACGM_PATH_BYTES];
};

/* One Python frame as the walk found it: its code object and where in it the frame is. */
struct py_frame {
	__u64 code;         /* PyCodeObject address; 0: a frame the interpreter owns (C-stack shim), skipped */
	__u32 instr;        /* byte offset of the current instruction in the code's bytecode */
	__s32 firstlineno;  /* co_firstlineno read at the walk: the agent re-reads it to tell a reused address */
};

/* The Python frames above an outermost traced call (innermost first), sent just before the
 * call's own record. */
struct py_stack_event {
	__u8 type;
	__u8 status;        /* enum eacgm_py_walk */
	__u16 count;        /* frames[0..count) are filled */
	__u32 pid;
	__u32 tid;
	__u32 pad0;
	__u64 call_id;      /* the traced call these frames made */
	struct py_frame frames[EACGM_PY_FRAMES];
};

enum eacgm_py_walk {
	EACGM_PY_WALK_DONE = 0,     /* the outermost frame was reached */
	EACGM_PY_WALK_DEEP = 1,     /* max_frames reached: outer frames are missing */
	EACGM_PY_WALK_FAULT = 2,    /* a frame could not be read (torn, or paged out) */
	EACGM_PY_WALK_NO_THREAD = 3,/* the thread has no Python thread state */
};

/* Where one traced process keeps its interpreter's state (py_layouts, by tgid), written by the
 * agent from its own table (3.10-3.12) or from the interpreter's _Py_DebugOffsets (3.13+). */
struct py_layout {
	__u64 runtime;      /* address of _PyRuntime in the process */
	__u16 interp_head;  /* _PyRuntime -> interpreters.head */
	__u16 threads_head; /* PyInterpreterState -> first PyThreadState */
	__u16 ts_next;
	__u16 ts_id;        /* native_thread_id (match_fs 0) or thread_id, i.e. pthread_self (match_fs 1) */
	__u16 ts_frame;     /* PyThreadState -> current frame, or -> cframe (cframe_frame set) */
	__u16 cframe_frame; /* _PyCFrame -> current_frame; EACGM_PY_NONE: ts_frame is the frame */
	__u16 fr_back;
	__u16 fr_code;
	__u16 fr_instr;     /* instruction pointer, or int index f_lasti (lasti set) */
	__u16 fr_owner;     /* EACGM_PY_NONE: frames have no owner byte */
	__u16 fr_size;      /* bytes read per frame, at most 128 */
	__u16 co_firstlineno;
	__u16 co_code;      /* co_code_adaptive: instruction pointers count from there */
	__u8 match_fs;
	__u8 lasti;
	__u8 tagged;        /* f_executable is a tagged _PyStackRef (3.14): clear the low bits */
	__u8 pad0[3];
	__u32 max_frames;   /* at most EACGM_PY_FRAMES */
	__u32 task_fsbase;  /* match_fs: offsetof(struct task_struct, thread.fsbase), from the kernel's BTF */
};

struct lib_open_event {
	__u8 type;
	__u8 gated;         /* 1: the process was stopped and waits for SIGCONT */
	__u16 pad0;
	__u32 pid;
	char path[EACGM_PATH_BYTES];
};

/* A thread exited with `depth` traced calls still open (frames left in the inflight map). */
struct thread_exit_event {
	__u8 type;
	__u8 pad0[3];
	__u32 pid;
	__u32 tid;
	__u32 depth;
	__u64 exit_ns;
};

/* A process executed a new program (its pid stays, its executable and environment change). */
struct exec_event {
	__u8 type;
	__u8 pad0[3];
	__u32 pid;
};

/* Per-probe settings written by the agent into the probe_conf array. */
struct probe_conf {
	__u8 has_return;    /* a uretprobe reports the return */
	__u8 exit_probes;   /* return_N is attached at the function's return instructions instead */
	__u8 returns_status;/* the return value is a status code: nonzero is a failure */
	__u8 always_send;   /* every call goes to the agent (its decoder keeps state: names, sizes) */
	__s32 deref_arg;    /* -1: none (32-bit: BCC's map type decoder has no signed char) */
	__s32 out_arg;      /* -1: none */
	__s32 str_arg;      /* -1: none */
	__s32 usdt_reg[3];  /* py_conf: byte offsets in struct pt_regs of USDT arguments 1-3 */
	__s32 key_arg;      /* call statistics are kept per value of this argument (kernel, communicator) */
	__s32 count_arg;    /* NCCL: element count; bytes = count * size of the datatype argument */
	__s32 dtype_arg;
	__u8 cyclable;      /* the guardrail may detach its entry before its return (cycle_gap) */
	__u8 pad1[3];
};

/* Call statistics, aggregated here for every call whether or not it is sent to the agent. */
struct stat_key {
	__u32 pid;
	__u16 probe_id;
	__u16 pad0;
	__s32 status;       /* 0: succeeded or has no status; else the return code or EACGM_STATUS_UNWOUND */
	__u32 pad1;
	__u64 key;          /* the key_arg's value; Python: hash of file, function and line (see py_key) */
};

struct call_stat {
	__u64 count;
	__u64 timed;        /* calls with a duration (a return was seen) */
	__u64 sum_ns;
	__u64 bytes;
	__u64 bw_sum;       /* sum of per-call bytes/s over timed successful calls that moved bytes */
	__u64 bw_count;
	__u64 dur[EACGM_DUR_BUCKETS];
	__u64 bw[EACGM_BW_BUCKETS];
};

/* Which calls become spans (sample_conf[0], written by the agent). */
struct sample_conf {
	__u32 ratio;        /* out of 65536 (65536: every call) */
	__u32 stats_on;     /* aggregate call statistics */
	__u64 slow_ns;      /* calls at least this long are always sent */
	__u64 slice_ns;     /* the unit of sampling: one thread's time slice (0: each outermost call) */
	__u64 resample_ns;  /* calls entered this long after their parent are decided afresh */
	__u64 salt;
	__u64 slice_max;    /* spans one thread may send in one sampled slice (0: no cap) */
};

/* One Python filter rule (py_rules array). A rule matches when every condition it sets holds:
 * the function name's FNV-1a hash, a prefix of the file path, and path components: each
 * component name a rule uses has a bit, py_names maps the component's FNV-1a hash to its bit,
 * and the rule needs all bits of `need` (the file's own component is hashed without its
 * extension, so "torch.nn.modules" matches .../torch/nn/modules/linear.py and "train" matches
 * .../train.py). The first matching rule decides; the agent ends the list with a rule that
 * matches everything. */
struct py_rule {
	__u8 used;
	__u8 include;
	__u8 prefix_len;
	__u8 pad0;
	__u32 func_hash;    /* 0: any function */
	__u64 need;         /* component bits, 0: any file */
	char prefix[16];
};

#endif
