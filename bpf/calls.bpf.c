/* Call capture for CUDA runtime, CUDA driver and NCCL (and any other C ABI library the agent's
 * probe catalog names). One uprobe (and, where the catalog asks, one uretprobe) per traced
 * function; entry and return are matched here, per thread, so user space receives one
 * completed-call record per call and never has to pair events.
 *
 * Each catalog row gets a probe slot N: the agent attaches entry_N / return_N and writes the
 * row's settings into probe_conf[N]. Knobs arrive as -D flags (see otel_eacgm/bpf_loader.py):
 *   EACGM_PROBE_SLOTS    number of entry_N/return_N pairs compiled (multiple of 10, <= 200)
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
#define EACGM_PROBE_SLOTS 100
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
	STAT_COUNT = 5,
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

static __always_inline int on_entry(struct pt_regs *ctx, __u32 probe_id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid))
		return 0;
	int slot = probe_id;
	struct probe_conf *conf = probe_conf.lookup(&slot);
	if (!conf)
		return 0;

	struct frame f = {};
	f.probe_id = probe_id;
	f.entry_ns = bpf_ktime_get_ns();
	f.call_id = new_call_id();
	read_args(ctx, f.args);
	int deref = conf->deref_arg;
	if (deref >= 0 && deref < EACGM_MAX_ARGS &&
	    bpf_probe_read_user(f.deref, sizeof(f.deref), (void *)f.args[deref]) == 0)
		f.flags |= EACGM_FLAG_DEREF;

	__u32 *dp = depths.lookup(&tid);
	__u32 depth = dp ? *dp : 0;
	if (depth > 0 && depth <= EACGM_MAX_DEPTH) {
		struct frame_key pk = {.tid = tid, .depth = depth - 1};
		struct frame *parent = inflight.lookup(&pk);
		if (parent) {
			f.parent_id = parent->call_id;
			f.root_id = parent->root_id;
		}
	}
	if (!f.root_id)
		f.root_id = f.call_id;

	if (!conf->has_return) {
		emit(&f, tgid, tid, depth, 0, f.entry_ns, 0, 0, conf->str_arg);
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
	__u32 *dp = depths.lookup(&tid);
	if (!dp || *dp == 0) {
		count(STAT_UNMATCHED_RETURN);
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
	int slot = probe_id;
	struct probe_conf *conf = probe_conf.lookup(&slot);
	if (!conf) {
		inflight.delete(&key);
		return 0;
	}
	__u64 out_value = 0;
	__u8 flags = EACGM_FLAG_RETURNED;
	int out = conf->out_arg;
	if (out >= 0 && out < EACGM_MAX_ARGS &&
	    bpf_probe_read_user(&out_value, sizeof(out_value), (void *)f->args[out]) == 0)
		flags |= EACGM_FLAG_OUT;
	emit(f, tgid, tid, depth, flags, bpf_ktime_get_ns(), PT_REGS_RC(ctx), out_value,
	     conf->str_arg);
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

#define EACGM_PROBE_PAIR(n)                                                    \
	int entry_##n(struct pt_regs *ctx) { return on_entry(ctx, n); }        \
	int return_##n(struct pt_regs *ctx) { return on_return(ctx, n); }
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
