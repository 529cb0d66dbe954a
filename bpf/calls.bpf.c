/* Call capture for every layer: CUDA runtime, CUDA driver, NCCL, PyTorch operators (any C ABI
 * or C++ function the agent's probe catalog or operator discovery names) and Python functions
 * (CPython's function__entry/function__return USDT probes). One uprobe (and, where asked, one
 * uretprobe) per traced function; entry and return are matched here, per thread, on one stack
 * shared by all layers, so user space receives one completed-call record per call, already
 * parented (Python > torch op > CUDA runtime > driver), and never has to pair events.
 *
 * Each catalog row gets a probe slot N: the agent attaches entry_N / return_N (or multi_probe
 * with N in the cookie) and writes the row's settings into probe_conf[N]. Knobs arrive as -D flags (see otel_eacgm/bpf_loader.py):
 *   EACGM_PROBE_SLOTS    number of entry_N/return_N pairs compiled (multiple of 10, <= 320)
 *   EACGM_RINGBUF_PAGES  ring buffer size in pages (power of two)
 *   EACGM_FILTER_PIDS    trace only tgids present in `targets` (else every process)
 *   EACGM_FOLLOW_FORKS   children of a traced process are traced too
 *   EACGM_GATE_OPENS     stop a traced process that opened a watched library until the agent
 *                        has attached to it (the agent sends SIGCONT)
 *   EACGM_AGENT_PID      never trace the agent itself
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "events.h"

#ifndef EACGM_PROBE_SLOTS
#define EACGM_PROBE_SLOTS 320
#endif
#ifndef EACGM_RINGBUF_PAGES
#define EACGM_RINGBUF_PAGES 256
#endif
#ifndef EACGM_AGENT_PID
#define EACGM_AGENT_PID 0
#endif

#define SIGSTOP_NUM 19

/* Counters read by the agent's self-telemetry; indexes mirror otel_eacgm/events.py. */
enum eacgm_stat {
	STAT_RINGBUF_DROPS = 0,   /* event lost: ring buffer full */
	STAT_DEPTH_OVERFLOW = 1,  /* call nested deeper than EACGM_MAX_DEPTH: not recorded */
	STAT_UNMATCHED_RETURN = 2,/* return without a recorded entry (probe attached mid-call) */
	STAT_MISMATCHED_RETURN = 3,/* return of another probe than the open frame's */
	STAT_INFLIGHT_FULL = 4,   /* inflight map full */
	STAT_SAMPLED_OUT = 5,     /* call not sent: outside the span sample, fast, succeeded */
	STAT_STATS_FULL = 6,      /* call_stats map full: the call is missing from the statistics */
	STAT_COUNT = 7,
};

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

struct open_path {
	char path[EACGM_PATH_BYTES];
};

BPF_RINGBUF_OUTPUT(events, EACGM_RINGBUF_PAGES);
BPF_ARRAY(probe_conf, struct probe_conf, EACGM_PROBE_SLOTS);
BPF_ARRAY(stats, __u64, STAT_COUNT);
BPF_ARRAY(next_id, __u64, 1);
BPF_HASH(depths, __u32, __u32, 16384);
BPF_HASH(inflight, struct frame_key, struct frame, 65536);
BPF_HASH(targets, __u32, __u8, 65536);
BPF_HASH(opening, __u32, struct open_path, 1024);
BPF_PERCPU_ARRAY(scratch, struct open_path, 1);
BPF_ARRAY(py_rules, struct py_rule, EACGM_PY_RULES);
BPF_ARRAY(py_conf, struct probe_conf, 1); /* usdt_reg of the interpreters' function probes */
#ifndef EACGM_STAT_KEYS
#define EACGM_STAT_KEYS 8192
#endif
BPF_HASH(call_stats, struct stat_key, struct call_stat, EACGM_STAT_KEYS);
BPF_PERCPU_ARRAY(stat_zero, struct call_stat, 1); /* a zeroed value to insert (too large for the stack) */
BPF_ARRAY(sample_conf, struct sample_conf, 1);

struct py_scratch {
	char func[EACGM_FUNC_BYTES];
	char file[EACGM_PATH_BYTES];
};
/* FNV-1a hash of a path component named by some rule -> the rule bits (py_rule.need) it sets */
BPF_HASH(py_names, __u32, __u64, EACGM_PY_NAMES);
BPF_PERCPU_ARRAY(py_scratch, struct py_scratch, 1);

static __always_inline void count(int stat)
{
	int key = stat;
	__u64 *v = stats.lookup(&key);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline int traced(__u32 tgid)
{
	if (tgid == EACGM_AGENT_PID)
		return 0;
#ifdef EACGM_FILTER_PIDS
	return targets.lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

static __always_inline __u64 new_call_id(void)
{
	int zero = 0;
	__u64 *next = next_id.lookup(&zero);
	if (!next)
		return 0;
	return __sync_fetch_and_add(next, 1) + 1;
}

/* --- sampling and call statistics ---------------------------------------------------------
 * Every call is counted here (count, failures by return code, a log2 duration histogram,
 * NCCL bytes and bandwidth), so the agent's statistics cover all calls at any sampling ratio
 * and whatever the ring buffer lost; only calls that become spans cross the ring buffer. */
static __always_inline __u64 mix64(__u64 x)
{
	x += 0x9E3779B97F4A7C15ULL;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

static __always_inline struct sample_conf *sampling(void)
{
	int zero = 0;
	return sample_conf.lookup(&zero);
}

struct slice_count {
	__u64 slice;
	__u64 sent;
};
/* Spans each thread sent in its current sampled slice (sample_conf.slice_max). */
BPF_TABLE("lru_hash", __u32, struct slice_count, slice_counts, 16384);

/* Counts one sampled call against its thread's slice; 0 when the slice has used its cap (a
 * child of a sampled call is never refused: subtrees stay whole, and count). A launch-bound
 * thread makes 100k+ calls a second: one sampled second of it would overflow the ring buffer,
 * so past the cap the slice's calls are counted in the statistics and not sent. */
static __always_inline int spend(struct sample_conf *sc, __u32 tid, __u64 now, int child)
{
	if (!sc->slice_max || !sc->slice_ns)
		return 1;
	__u64 slice = now / sc->slice_ns;
	struct slice_count *c = slice_counts.lookup(&tid);
	if (!c || c->slice != slice) {
		struct slice_count fresh = {.slice = slice, .sent = 1};
		slice_counts.update(&tid, &fresh);
		return 1;
	}
	if (c->sent >= sc->slice_max && !child)
		return 0;
	c->sent++;
	return 1;
}

/* Whether a call entered at `now` is in the span sample. Calls follow their parent, unless
 * they start long after it (a main() open for hours: its steps are decided one by one); the
 * others are decided per thread and time slice, the unit the agent groups outermost calls in. */
static __always_inline int in_sample(struct sample_conf *sc, struct frame *parent, __u32 tid, __u64 now,
				     __u64 call_id)
{
	if (!sc || sc->ratio >= 65536)
		return 1;
	if (parent && now - parent->entry_ns < sc->resample_ns)
		return (parent->flags & EACGM_FLAG_SAMPLED) && spend(sc, tid, now, 1);
	if (!sc->ratio)
		return 0;
	__u64 x = sc->slice_ns ? (((__u64)tid << 32) ^ (now / sc->slice_ns)) : call_id;
	return (mix64(x ^ sc->salt) & 0xffff) < sc->ratio && spend(sc, tid, now, 0);
}

static __always_inline __u64 nccl_type_size(__u64 dtype)
{
	switch ((__u32)dtype) {
	case 0: case 1: case 10: case 11: return 1;      /* int8, uint8, float8e4m3, float8e5m2 */
	case 6: case 9: return 2;                         /* float16, bfloat16 */
	case 2: case 3: case 7: return 4;                 /* int32, uint32, float32 */
	case 4: case 5: case 8: return 8;                 /* int64, uint64, float64 */
	}
	return 0;
}

/* Python calls are counted per function: their file, function name and line (the interpreter's
 * string addresses are stable for a code object). otel_eacgm/metrics/call_stats.py mirrors it. */
static __always_inline __u64 py_key(__u64 *args)
{
	return args[0] ^ (args[1] * 0x9E3779B97F4A7C15ULL) ^ ((args[2] & 0xffffffffULL) << 32);
}

static __always_inline __u32 log2_bucket(__u64 v, int shift)
{
	__u32 b = v ? bpf_log2l(v) : 0;
	b = b > shift ? b - shift : 0;
	return b & 31;
}

/* Counts one call; returns 1 when it opened a new statistics entry. */
static __always_inline int account(struct sample_conf *sc, struct probe_conf *conf, struct frame *f, __u32 tgid,
				   __s32 status, __u64 dur_ns, int timed, const int python)
{
	if (!sc || !sc->stats_on)
		return 0;
	struct stat_key key = {};
	key.pid = tgid;
	key.probe_id = f->probe_id;
	key.status = status;
	int k = conf->key_arg;
	if (python)
		key.key = py_key(f->args);
	else if (k >= 0 && k < EACGM_MAX_ARGS)
		key.key = f->args[k];
	int fresh = 0;
	struct call_stat *st = call_stats.lookup(&key);
	if (!st) {
		int zero = 0;
		struct call_stat *z = stat_zero.lookup(&zero);
		if (!z)
			return 0;
		fresh = call_stats.insert(&key, z) == 0;
		st = call_stats.lookup(&key);
		if (!st) {
			count(STAT_STATS_FULL);
			return 0;
		}
	}
	__sync_fetch_and_add(&st->count, 1);
	if (timed) {
		__sync_fetch_and_add(&st->timed, 1);
		__sync_fetch_and_add(&st->sum_ns, dur_ns);
		__sync_fetch_and_add(&st->dur[log2_bucket(dur_ns, EACGM_DUR_SHIFT)], 1);
	}
	int c = conf->count_arg, d = conf->dtype_arg;
	if (c >= 0 && c < EACGM_MAX_ARGS && d >= 0 && d < EACGM_MAX_ARGS) {
		__u64 bytes = f->args[c] * nccl_type_size(f->args[d]);
		__sync_fetch_and_add(&st->bytes, bytes);
		if (timed && status == 0 && bytes && dur_ns) {
			/* bytes * 1e9 stays below 2^64 up to 16 GiB */
			__u64 bw = bytes < (1ULL << 34) ? bytes * 1000000000ULL / dur_ns : bytes / dur_ns * 1000000000ULL;
			__sync_fetch_and_add(&st->bw_sum, bw);
			__sync_fetch_and_add(&st->bw_count, 1);
			__sync_fetch_and_add(&st->bw[log2_bucket(bw, EACGM_BW_SHIFT)], 1);
		}
	}
	return fresh;
}

/* A sent call's parent is sent too (KEEP), so that no span arrives without its ancestors. */
static __always_inline void keep_parent(__u32 tid, __u32 depth)
{
	if (depth == 0 || depth > EACGM_MAX_DEPTH)
		return;
	struct frame_key pk = {.tid = tid, .depth = depth - 1};
	struct frame *parent = inflight.lookup(&pk);
	if (parent)
		parent->flags |= EACGM_FLAG_KEEP;
}

/* Whether a completed call is sent to the agent; counts the ones that are not. */
static __always_inline int to_send(struct sample_conf *sc, struct probe_conf *conf, struct frame *f, __s32 status,
				   __u64 dur_ns, int fresh)
{
	if ((f->flags & (EACGM_FLAG_SAMPLED | EACGM_FLAG_KEEP)) || status || conf->always_send || fresh ||
	    (sc && dur_ns >= sc->slow_ns)) {
		return 1;
	}
	count(STAT_SAMPLED_OUT);
	return 0;
}

static __always_inline void read_args(struct pt_regs *ctx, __u64 *args)
{
	args[0] = PT_REGS_PARM1(ctx);
	args[1] = PT_REGS_PARM2(ctx);
	args[2] = PT_REGS_PARM3(ctx);
	args[3] = PT_REGS_PARM4(ctx);
	args[4] = PT_REGS_PARM5(ctx);
	args[5] = PT_REGS_PARM6(ctx);
	/* At function entry the stack pointer addresses the return address; the 7th and later
	 * integer arguments follow it in 8-byte slots. */
	bpf_probe_read_user(&args[6], 4 * sizeof(__u64), (void *)(PT_REGS_SP(ctx) + 8));
}

static __always_inline void fill_event(struct call_event *ev, struct frame *f, __u32 tgid,
				       __u32 tid, __u32 depth)
{
	ev->pid = tgid;
	ev->tid = tid;
	ev->cpu = bpf_get_smp_processor_id();
	ev->depth = depth;
	ev->probe_id = f->probe_id;
	ev->call_id = f->call_id;
	ev->parent_id = f->parent_id;
	ev->root_id = f->root_id;
	ev->entry_ns = f->entry_ns;
	__builtin_memcpy(ev->args, f->args, sizeof(ev->args));
	__builtin_memcpy(ev->deref, f->deref, sizeof(ev->deref));
}

static __always_inline void emit(struct frame *f, __u32 tgid, __u32 tid, __u32 depth, __u8 flags,
				 __u64 exit_ns, __s64 ret, __u64 out_value, int str_arg)
{
	if (str_arg >= 0 && str_arg < EACGM_MAX_ARGS) {
		struct call_str_event *sev = events.ringbuf_reserve(sizeof(struct call_str_event));
		if (!sev) {
			count(STAT_RINGBUF_DROPS);
			return;
		}
		fill_event(&sev->call, f, tgid, tid, depth);
		sev->call.type = EACGM_EVENT_CALL_STR;
		sev->call.flags = flags | f->flags;
		sev->call.exit_ns = exit_ns;
		sev->call.ret = ret;
		sev->call.out_value = out_value;
		if (bpf_probe_read_user_str(sev->str, sizeof(sev->str), (void *)f->args[str_arg]) < 0)
			sev->str[0] = 0;
		events.ringbuf_submit(sev, 0);
		return;
	}
	struct call_event *ev = events.ringbuf_reserve(sizeof(struct call_event));
	if (!ev) {
		count(STAT_RINGBUF_DROPS);
		return;
	}
	fill_event(ev, f, tgid, tid, depth);
	ev->type = EACGM_EVENT_CALL;
	ev->flags = flags | f->flags;
	ev->exit_ns = exit_ns;
	ev->ret = ret;
	ev->out_value = out_value;
	events.ringbuf_submit(ev, 0);
}

/* --- Python functions -------------------------------------------------------------------- */
#define FNV_OFFSET 2166136261u
#define FNV_PRIME 16777619u

static __always_inline __u64 usdt_arg(struct pt_regs *ctx, int off)
{
	__u64 v = 0;
	if (off >= 0 && off <= (int)(sizeof(struct pt_regs) - sizeof(__u64)))
		bpf_probe_read_kernel(&v, sizeof(v), (char *)ctx + off);
	return v;
}

/* Whether a Python function is traced: the agent's rules decide (first match wins). Every
 * Python call of the process reaches this probe, so a decision costs one pass over the file
 * name with a hash lookup per path component, and a few compares per rule; functions not
 * traced leave the stack untouched. */
static __always_inline int py_traced(__u64 file_ptr, __u64 func_ptr)
{
	int zero = 0;
	struct py_scratch *s = py_scratch.lookup(&zero);
	if (!s)
		return 0;
	if (bpf_probe_read_user_str(s->func, sizeof(s->func), (void *)func_ptr) < 0 ||
	    bpf_probe_read_user_str(s->file, sizeof(s->file), (void *)file_ptr) < 0)
		return 0;
	__u32 fh = FNV_OFFSET;
	for (int i = 0; i < EACGM_FUNC_BYTES; i++) {
		char c = s->func[i];
		if (!c)
			break;
		fh = (fh ^ (__u8)c) * FNV_PRIME;
	}
	/* h == FNV_OFFSET marks an empty component (a length counter would be tracked exactly by
	 * the verifier, once per value). */
	__u64 have = 0;
	__u32 h = FNV_OFFSET, h_dot = 0;
	for (int i = 0; i < EACGM_PATH_BYTES; i++) {
		char c = s->file[i];
		if (c == '/' || c == 0) {
			if (h != FNV_OFFSET) {
				/* the file's own component counts without its extension (module name) */
				__u32 comp = (c == 0 && h_dot) ? h_dot : h;
				__u64 *bits = py_names.lookup(&comp);
				if (bits)
					have |= *bits;
			}
			if (!c)
				break;
			h = FNV_OFFSET;
			h_dot = 0;
			continue;
		}
		if (c == '.')
			h_dot = h;
		h = (h ^ (__u8)c) * FNV_PRIME;
	}
	for (int r = 0; r < EACGM_PY_RULES; r++) {
		int key = r;
		struct py_rule *rule = py_rules.lookup(&key);
		if (!rule || !rule->used)
			return 0;
		if (rule->func_hash && rule->func_hash != fh)
			continue;
		if ((have & rule->need) != rule->need)
			continue;
		int ok = 1;
#pragma unroll
		for (int j = 0; j < 16; j++) {
			if (j < rule->prefix_len && s->file[j] != rule->prefix[j])
				ok = 0;
		}
		if (ok)
			return rule->include;
	}
	return 0;
}

static __always_inline void emit_py(struct frame *f, __u32 tgid, __u32 tid, __u32 depth, __u64 exit_ns)
{
	struct py_call_event *ev = events.ringbuf_reserve(sizeof(struct py_call_event));
	if (!ev) {
		count(STAT_RINGBUF_DROPS);
		return;
	}
	fill_event(&ev->call, f, tgid, tid, depth);
	ev->call.type = EACGM_EVENT_PY_CALL;
	ev->call.flags = EACGM_FLAG_RETURNED | f->flags;
	ev->call.exit_ns = exit_ns;
	ev->call.ret = 0;
	ev->call.out_value = 0;
	if (bpf_probe_read_user_str(ev->func, sizeof(ev->func), (void *)f->args[1]) < 0)
		ev->func[0] = 0;
	if (bpf_probe_read_user_str(ev->file, sizeof(ev->file), (void *)f->args[0]) < 0)
		ev->file[0] = 0;
	events.ringbuf_submit(ev, 0);
}

/* --- every layer ------------------------------------------------------------------------- */
/* Frames that a C++ exception unwound: their return instructions never ran. A frame is gone
 * when the stack pointer is back above its entry stack pointer (the stack grows down; at a
 * return instruction, back at it), which the thread's next entry or return shows. Only frames
 * of exit-probed functions can be left so (uretprobes see every return, Python returns come
 * from the interpreter). The check is one lookup; the rare cleanup runs in its own program
 * (tail call `unwind`, which then continues with the interrupted program) to keep each
 * program's verification small. */
enum eacgm_tail {
	TAIL_ENTRY = 0, TAIL_RETURN = 1, TAIL_UNWIND = 2, TAIL_PY_ENTRY = 3, TAIL_PY_RETURN = 4,
	TAIL_COUNT = 5,
};
BPF_PROG_ARRAY(tails, TAIL_COUNT);
struct slot_call {
	__u32 slot;
	__u32 cont; /* the program `unwind` continues with */
};
BPF_PERCPU_ARRAY(slot_arg, struct slot_call, 1);

static __always_inline int stale(struct frame *top, __u64 sp, int at_return)
{
	return top->exit_probes && (at_return ? top->sp < sp : top->sp <= sp);
}

/* Tail-calls `unwind` when the thread's top frame is stale; returns only when it is not (or
 * the tail call failed). */
static __always_inline void check_unwound(struct pt_regs *ctx, __u32 tid, __u32 depth, int at_return, __u32 cont)
{
	if (depth == 0 || depth > EACGM_MAX_DEPTH)
		return;
	struct frame_key key = {.tid = tid, .depth = depth - 1};
	struct frame *top = inflight.lookup(&key);
	if (!top || !stale(top, PT_REGS_SP(ctx), at_return))
		return;
	int zero = 0;
	struct slot_call *call = slot_arg.lookup(&zero);
	if (!call)
		return;
	call->cont = cont;
	tails.call(ctx, TAIL_UNWIND);
}

int unwind(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	int zero = 0;
	struct slot_call *call = slot_arg.lookup(&zero);
	if (!call)
		return 0;
	__u32 *dp = depths.lookup(&tid);
	int at_return = call->cont == TAIL_RETURN || call->cont == TAIL_PY_RETURN;
	__u32 depth = dp ? *dp : 0;
	struct frame_key key = {.tid = tid, .depth = depth - 1};
	struct frame *top = dp && depth > 0 && depth <= EACGM_MAX_DEPTH ? inflight.lookup(&key) : NULL;
	if (dp && top && stale(top, PT_REGS_SP(ctx), at_return)) {
		/* one frame per pass; the program calls itself for the next (the kernel bounds the
		 * chain at 33 tail calls, far more than exception-unwound operator frames) */
		int slot = top->probe_id;
		struct probe_conf *conf = probe_conf.lookup(&slot);
		if (conf)
			account(sampling(), conf, top, tgid, EACGM_STATUS_UNWOUND, 0, 0, 0);
		emit(top, tgid, tid, depth - 1, EACGM_FLAG_UNWOUND, bpf_ktime_get_ns(), 0, 0, -1);
		keep_parent(tid, depth - 1);
		inflight.delete(&key);
		if (depth == 1)
			depths.delete(&tid);
		else
			*dp = depth - 1;
		tails.call(ctx, TAIL_UNWIND);
	}
	tails.call(ctx, call->cont);
	return 0;
}

/* function__return: pops the thread's top frame only when it is this function's frame (same
 * file and name strings); a return of a function that was not traced changes nothing. */
static __always_inline int on_py_return(struct pt_regs *ctx, __u32 probe_id, struct probe_conf *conf,
					__u32 tgid, __u32 tid)
{
	if (!traced(tgid))
		return 0;
	__u32 *dp = depths.lookup(&tid);
	if (!dp || *dp == 0 || *dp > EACGM_MAX_DEPTH)
		return 0;
	check_unwound(ctx, tid, *dp, 0, TAIL_PY_RETURN);
	__u32 depth = *dp - 1;
	struct frame_key key = {.tid = tid, .depth = depth};
	struct frame *f = inflight.lookup(&key);
	if (!f || f->probe_id != probe_id || f->args[0] != usdt_arg(ctx, conf->usdt_reg[0]) ||
	    f->args[1] != usdt_arg(ctx, conf->usdt_reg[1]))
		return 0;
	if (f->repeats) {
		f->repeats--;
		return 0;
	}
	if (depth == 0)
		depths.delete(&tid);
	else
		*dp = depth;
	struct sample_conf *sc = sampling();
	__u64 now = bpf_ktime_get_ns();
	int fresh = account(sc, conf, f, tgid, 0, now - f->entry_ns, 1, 1);
	if (to_send(sc, conf, f, 0, now - f->entry_ns, fresh)) {
		emit_py(f, tgid, tid, depth, now);
		keep_parent(tid, depth);
	}
	inflight.delete(&key);
	return 0;
}

/* `python` is a constant: the slot programs compile without the Python branch. */
static __always_inline int on_entry(struct pt_regs *ctx, __u32 probe_id, const int python)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid))
		return 0;
	int slot = python ? 0 : probe_id;
	struct probe_conf *conf = python ? py_conf.lookup(&slot) : probe_conf.lookup(&slot);
	if (!conf)
		return 0;

	struct frame f = {};
	__u32 *dp = depths.lookup(&tid);
	__u32 depth = dp ? *dp : 0;
	f.sp = PT_REGS_SP(ctx);
	check_unwound(ctx, tid, depth, 0, python ? TAIL_PY_ENTRY : TAIL_ENTRY);
	if (python) {
		/* Not counted past the stack's end: on_py_return could not tell its frame apart. */
		if (depth >= EACGM_MAX_DEPTH) {
			count(STAT_DEPTH_OVERFLOW);
			return 0;
		}
		f.args[0] = usdt_arg(ctx, conf->usdt_reg[0]); /* file name */
		f.args[1] = usdt_arg(ctx, conf->usdt_reg[1]); /* function name */
		f.args[2] = usdt_arg(ctx, conf->usdt_reg[2]); /* line number */
		/* The same function entered again at the same C stack level with nothing traced in
		 * between: CPython 3.11 fires function__entry and function__return twice per call
		 * while a profile function is set, and an inlined direct recursion looks the same.
		 * One frame counts the repeats; as many returns are absorbed before it pops. */
		if (depth > 0) {
			struct frame_key top_key = {.tid = tid, .depth = depth - 1};
			struct frame *top = inflight.lookup(&top_key);
			if (top && top->probe_id == EACGM_PY_PROBE_ID && top->sp == f.sp &&
			    top->args[0] == f.args[0] && top->args[1] == f.args[1]) {
				top->repeats++;
				return 0;
			}
		}
		if (!py_traced(f.args[0], f.args[1]))
			return 0;
	} else {
		read_args(ctx, f.args);
		int deref = conf->deref_arg;
		if (deref >= 0 && deref < EACGM_MAX_ARGS &&
		    bpf_probe_read_user(f.deref, sizeof(f.deref), (void *)f.args[deref]) == 0)
			f.flags |= EACGM_FLAG_DEREF;
	}
	f.probe_id = probe_id;
	f.exit_probes = conf->exit_probes;
	f.entry_ns = bpf_ktime_get_ns();
	f.call_id = new_call_id();
	struct frame *parent = NULL;
	if (depth > 0 && depth <= EACGM_MAX_DEPTH) {
		struct frame_key pk = {.tid = tid, .depth = depth - 1};
		parent = inflight.lookup(&pk);
		if (parent) {
			f.parent_id = parent->call_id;
			f.root_id = parent->root_id;
		}
	}
	if (!f.root_id)
		f.root_id = f.call_id;
	struct sample_conf *sc = sampling();
	if (in_sample(sc, parent, tid, f.entry_ns, f.call_id))
		f.flags |= EACGM_FLAG_SAMPLED;

	if (!conf->has_return && !conf->exit_probes) {
		account(sc, conf, &f, tgid, 0, 0, 0, 0);
		if (to_send(sc, conf, &f, 0, 0, 0)) {
			emit(&f, tgid, tid, depth, 0, f.entry_ns, 0, 0, conf->str_arg);
			keep_parent(tid, depth);
		}
		return 0;
	}
	if (depth < EACGM_MAX_DEPTH) {
		struct frame_key key = {.tid = tid, .depth = depth};
		if (inflight.update(&key, &f) != 0)
			count(STAT_INFLIGHT_FULL);
	} else {
		count(STAT_DEPTH_OVERFLOW);
	}
	__u32 next_depth = depth + 1;
	depths.update(&tid, &next_depth);
	return 0;
}

static __always_inline int on_return(struct pt_regs *ctx, __u32 probe_id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid))
		return 0;
	int slot = probe_id;
	struct probe_conf *conf = probe_conf.lookup(&slot);
	if (!conf)
		return 0;
	__u32 *dp = depths.lookup(&tid);
	if (!dp || *dp == 0) {
		count(STAT_UNMATCHED_RETURN);
		return 0;
	}
	if (conf->exit_probes) {
		/* at a return instruction the stack pointer is the entry's again: frames below it
		 * were unwound, and a frame with another stack pointer is not this call's */
		check_unwound(ctx, tid, *dp, 1, TAIL_RETURN);
		struct frame_key top_key = {.tid = tid, .depth = *dp - 1};
		struct frame *top = *dp <= EACGM_MAX_DEPTH ? inflight.lookup(&top_key) : NULL;
		if (top && top->sp != PT_REGS_SP(ctx))
			return 0;
	}
	__u32 depth = *dp - 1;
	if (depth == 0)
		depths.delete(&tid);
	else
		*dp = depth;
	if (depth >= EACGM_MAX_DEPTH)
		return 0;

	struct frame_key key = {.tid = tid, .depth = depth};
	struct frame *f = inflight.lookup(&key);
	if (!f) {
		count(STAT_UNMATCHED_RETURN);
		return 0;
	}
	if (f->probe_id != probe_id) {
		count(STAT_MISMATCHED_RETURN);
		inflight.delete(&key);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	__s64 ret = PT_REGS_RC(ctx);
	__s32 status = conf->returns_status ? (__s32)ret : 0;
	struct sample_conf *sc = sampling();
	account(sc, conf, f, tgid, status, now - f->entry_ns, 1, 0);
	if (!to_send(sc, conf, f, status, now - f->entry_ns, 0)) {
		inflight.delete(&key);
		return 0;
	}
	__u64 out_value = 0;
	__u8 flags = EACGM_FLAG_RETURNED;
	int out = conf->out_arg;
	if (out >= 0 && out < EACGM_MAX_ARGS &&
	    bpf_probe_read_user(&out_value, sizeof(out_value), (void *)f->args[out]) == 0)
		flags |= EACGM_FLAG_OUT;
	emit(f, tgid, tid, depth, flags, now, ret, out_value, conf->str_arg);
	keep_parent(tid, depth);
	inflight.delete(&key);
	return 0;
}

/* Calls still open when their thread exits (the process was killed mid-call) must not vanish:
 * tell the agent how many frames the thread left in `inflight`; it reads them, reports them
 * as incomplete calls and frees them. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	__u32 *dp = depths.lookup(&tid);
	if (dp) {
		struct thread_exit_event *ev = events.ringbuf_reserve(sizeof(*ev));
		if (ev) {
			ev->type = EACGM_EVENT_THREAD_EXIT;
			ev->pid = tgid;
			ev->tid = tid;
			ev->depth = *dp;
			ev->exit_ns = bpf_ktime_get_ns();
			events.ringbuf_submit(ev, 0);
		} else {
			count(STAT_RINGBUF_DROPS);
		}
		depths.delete(&tid);
	}
#ifdef EACGM_FILTER_PIDS
	if (tgid == tid)
		targets.delete(&tgid);
#endif
	return 0;
}

/* A process that executes another program keeps its pid but is then that program (a launched
 * command's waiter becoming the command, a wrapper script exec'ing python): the agent reads
 * its resource again. The tracepoint fires once the new image is set up, so /proc/PID shows
 * the new executable and environment. A lost event costs a stale name, not a call: it is not
 * counted as a ring-buffer drop. */
TRACEPOINT_PROBE(sched, sched_process_exec)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
#ifdef EACGM_FILTER_PIDS
	if (!targets.lookup(&tgid))
		return 0;
#endif
	struct exec_event *ev = events.ringbuf_reserve(sizeof(*ev));
	if (ev) {
		ev->type = EACGM_EVENT_EXEC;
		ev->pad0[0] = ev->pad0[1] = ev->pad0[2] = 0;
		ev->pid = tgid;
		events.ringbuf_submit(ev, 0);
	}
	return 0;
}

#if defined(EACGM_FILTER_PIDS) && defined(EACGM_FOLLOW_FORKS)
TRACEPOINT_PROBE(sched, sched_process_fork)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (targets.lookup(&tgid)) {
		__u32 child = args->child_pid;
		__u8 one = 1;
		targets.update(&child, &one);
	}
	return 0;
}
#endif

/* Library discovery: a traced process opening one of the watched libraries wakes the agent at
 * once (it then reads /proc/PID/maps), instead of waiting for the next periodic scan. Prefixes
 * mirror otel_eacgm/probes/libraries.py. */
static __always_inline int has_prefix(const char *s, const char *prefix, int n)
{
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (i >= n)
			return 1;
		if (s[i] != prefix[i])
			return 0;
	}
	return 1;
}

static __always_inline int watched_library(struct open_path *p)
{
	int base = 0;
	for (int i = 0; i < EACGM_PATH_BYTES - 16; i++) {
		char c = p->path[i];
		if (c == 0)
			break;
		if (c == '/')
			base = i + 1;
	}
	if (base < 0 || base >= EACGM_PATH_BYTES - 16)
		return 0;
	const char *name = &p->path[base];
	return has_prefix(name, "libcudart", 9) || has_prefix(name, "libcuda.", 8) ||
	       has_prefix(name, "libnccl", 7) || has_prefix(name, "libtorch_cpu", 12) ||
	       has_prefix(name, "libpython3", 10);
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid))
		return 0;
	int zero = 0;
	struct open_path *p = scratch.lookup(&zero);
	if (!p)
		return 0;
	if (bpf_probe_read_user_str(p->path, sizeof(p->path), args->filename) <= 0)
		return 0;
	if (watched_library(p))
		opening.update(&tid, p);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_openat)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct open_path *p = opening.lookup(&tid);
	if (!p)
		return 0;
	if (args->ret >= 0) {
		struct lib_open_event *ev = events.ringbuf_reserve(sizeof(struct lib_open_event));
		if (ev) {
			ev->type = EACGM_EVENT_LIB_OPEN;
			ev->gated = 0;
			ev->pid = tgid;
			bpf_probe_read_kernel(ev->path, sizeof(ev->path), p->path);
#ifdef EACGM_GATE_OPENS
			if (bpf_send_signal(SIGSTOP_NUM) == 0)
				ev->gated = 1;
#endif
			events.ringbuf_submit(ev, 0);
		} else {
			count(STAT_RINGBUF_DROPS);
		}
	}
	opening.delete(&tid);
	return 0;
}

int py_entry(struct pt_regs *ctx)
{
	return on_entry(ctx, EACGM_PY_PROBE_ID, 1);
}

int py_return(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	int zero = 0;
	struct probe_conf *conf = py_conf.lookup(&zero);
	if (!conf)
		return 0;
	return on_py_return(ctx, EACGM_PY_PROBE_ID, conf, pid_tgid >> 32, (__u32)pid_tgid);
}

/* The slot programs share one copy of the entry and return code: each slot program stores its
 * number and tail-calls the common program, so a slot costs a few instructions to compile and
 * verify (BCC has no BPF-to-BPF calls). A tail call keeps the CPU, so the per-CPU `slot_arg`
 * cell is the common program's argument. */
int slot_entry(struct pt_regs *ctx)
{
	int zero = 0;
	struct slot_call *call = slot_arg.lookup(&zero);
	return call ? on_entry(ctx, call->slot, 0) : 0;
}

int slot_return(struct pt_regs *ctx)
{
	int zero = 0;
	struct slot_call *call = slot_arg.lookup(&zero);
	return call ? on_return(ctx, call->slot) : 0;
}

static __always_inline int to_slot(struct pt_regs *ctx, __u32 n, int tail)
{
	int zero = 0;
	struct slot_call *call = slot_arg.lookup(&zero);
	if (!call)
		return 0;
	call->slot = n;
	tails.call(ctx, tail);
	return 0; /* not reached unless the common programs are missing */
}

/* With uprobe_multi links (kernel 6.6+, otel_eacgm/uprobe_multi.py) this one program serves
 * every probe: each offset's cookie names its slot (low 32 bits) and the common program to run
 * (high 32 bits, an eacgm_tail), so one link can hold any number of probes of one file. */
int multi_probe(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	return to_slot(ctx, (__u32)cookie, (int)(cookie >> 32));
}

#define EACGM_PROBE_PAIR(n)                                                    \
	int entry_##n(struct pt_regs *ctx) { return to_slot(ctx, n, TAIL_ENTRY); } \
	int return_##n(struct pt_regs *ctx) { return to_slot(ctx, n, TAIL_RETURN); }
#define EACGM_PROBE_TEN(t)                                                     \
	EACGM_PROBE_PAIR(t##0) EACGM_PROBE_PAIR(t##1) EACGM_PROBE_PAIR(t##2)   \
	EACGM_PROBE_PAIR(t##3) EACGM_PROBE_PAIR(t##4) EACGM_PROBE_PAIR(t##5)   \
	EACGM_PROBE_PAIR(t##6) EACGM_PROBE_PAIR(t##7) EACGM_PROBE_PAIR(t##8)   \
	EACGM_PROBE_PAIR(t##9)

/* Slots 0..9 are pasted without a tens digit (an empty t), so that no slot is an octal
 * literal such as 08. */
EACGM_PROBE_TEN()
#if EACGM_PROBE_SLOTS > 10
EACGM_PROBE_TEN(1) EACGM_PROBE_TEN(2) EACGM_PROBE_TEN(3) EACGM_PROBE_TEN(4)
#endif
#if EACGM_PROBE_SLOTS > 50
EACGM_PROBE_TEN(5) EACGM_PROBE_TEN(6) EACGM_PROBE_TEN(7) EACGM_PROBE_TEN(8) EACGM_PROBE_TEN(9)
#endif
#if EACGM_PROBE_SLOTS > 100
EACGM_PROBE_TEN(10) EACGM_PROBE_TEN(11) EACGM_PROBE_TEN(12) EACGM_PROBE_TEN(13)
EACGM_PROBE_TEN(14) EACGM_PROBE_TEN(15) EACGM_PROBE_TEN(16) EACGM_PROBE_TEN(17)
EACGM_PROBE_TEN(18) EACGM_PROBE_TEN(19)
#endif
#if EACGM_PROBE_SLOTS > 200
EACGM_PROBE_TEN(20) EACGM_PROBE_TEN(21) EACGM_PROBE_TEN(22) EACGM_PROBE_TEN(23)
EACGM_PROBE_TEN(24) EACGM_PROBE_TEN(25) EACGM_PROBE_TEN(26) EACGM_PROBE_TEN(27)
EACGM_PROBE_TEN(28) EACGM_PROBE_TEN(29) EACGM_PROBE_TEN(30) EACGM_PROBE_TEN(31)
#endif
