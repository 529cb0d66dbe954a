/* Call capture for every layer: CUDA runtime, CUDA driver, NCCL, PyTorch operators (any C ABI
 * or C++ function the agent's probe catalog or operator discovery names) and Python functions
 * (CPython's function__entry/function__return USDT probes). One uprobe (and, where asked, one
 * uretprobe) per traced function; entry and return are matched here, per thread, on one stack
 * shared by all layers, so user space receives one completed-call record per call, already
 * parented (Python > torch op > CUDA runtime > driver), and never has to pair events.
 *
 * This is the one file BCC compiles (otel_eacgm/bpf_program.py, with -I bpf/); each concern is a
 * header under calls/ (bpf/README.md lists them). Knobs arrive as -D flags: calls/knobs.bpf.h.
 * Two things must stay in this file, because BCC does them only in the file it compiles:
 *   - map operations: `inflight.lookup(&k)` becomes a BPF helper call here; in an included
 *     header it compiles to a call through a null pointer. The headers use the accessors below.
 *   - programs: only a function defined here becomes a BPF program that can be attached.
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "events.h"
#include "calls/knobs.bpf.h"
#include "calls/records.bpf.h"
#include "calls/maps.bpf.h"

/* --- map operations: one accessor per operation the headers use ------------------------- */
static __always_inline void *events_reserve(__u64 size) { return events.ringbuf_reserve(size); }
static __always_inline void events_submit(void *rec) { events.ringbuf_submit(rec, 0); }
static __always_inline __u64 *stats_lookup(int *key) { return stats.lookup(key); }
static __always_inline struct probe_conf *probe_conf_lookup(int *slot) { return probe_conf.lookup(slot); }
static __always_inline struct probe_conf *py_conf_lookup(int *zero) { return py_conf.lookup(zero); }
static __always_inline struct sample_conf *sample_conf_lookup(int *zero) { return sample_conf.lookup(zero); }
static __always_inline __u32 *cycle_gap_lookup(int *zero) { return cycle_gap.lookup(zero); }
static __always_inline __u8 *targets_lookup(__u32 *tgid) { return targets.lookup(tgid); }
static __always_inline int targets_update(__u32 *tgid, __u8 *one) { return targets.update(tgid, one); }
static __always_inline int targets_delete(__u32 *tgid) { return targets.delete(tgid); }
static __always_inline __u8 *fork_holds_lookup(__u32 *pid) { return fork_holds.lookup(pid); }
static __always_inline int fork_holds_update(__u32 *pid, __u8 *one) { return fork_holds.update(pid, one); }
static __always_inline int fork_holds_delete(__u32 *pid) { return fork_holds.delete(pid); }
static __always_inline __u32 *holds_off_lookup(int *zero) { return holds_off.lookup(zero); }
static __always_inline int held_update(__u32 *pid, __u8 *one) { return held.update(pid, one); }
static __always_inline int held_delete(__u32 *pid) { return held.delete(pid); }
static __always_inline __u64 *next_id_lookup(int *zero) { return next_id.lookup(zero); }
static __always_inline __u32 *depths_lookup(__u32 *tid) { return depths.lookup(tid); }
static __always_inline int depths_update(__u32 *tid, __u32 *depth) { return depths.update(tid, depth); }
static __always_inline int depths_delete(__u32 *tid) { return depths.delete(tid); }
static __always_inline struct frame *inflight_lookup(struct frame_key *key) { return inflight.lookup(key); }
static __always_inline int inflight_update(struct frame_key *key, struct frame *f) { return inflight.update(key, f); }
static __always_inline int inflight_delete(struct frame_key *key) { return inflight.delete(key); }
static __always_inline struct slice_count *slice_counts_lookup(__u32 *tid) { return slice_counts.lookup(tid); }
static __always_inline int slice_counts_update(__u32 *tid, struct slice_count *c) { return slice_counts.update(tid, c); }
static __always_inline struct call_stat *call_stats_lookup(struct stat_key *key) { return call_stats.lookup(key); }
static __always_inline int call_stats_insert(struct stat_key *key, struct call_stat *st) { return call_stats.insert(key, st); }
static __always_inline struct call_stat *stat_zero_lookup(int *zero) { return stat_zero.lookup(zero); }
static __always_inline struct py_rule *py_rules_lookup(int *key) { return py_rules.lookup(key); }
static __always_inline __u64 *py_names_lookup(__u32 *hash) { return py_names.lookup(hash); }
static __always_inline struct py_scratch *py_scratch_lookup(int *zero) { return py_scratch.lookup(zero); }
static __always_inline struct py_layout *py_layouts_lookup(__u32 *tgid) { return py_layouts.lookup(tgid); }
static __always_inline __u64 *py_tstates_lookup(__u32 *tid) { return py_tstates.lookup(tid); }
static __always_inline int py_tstates_update(__u32 *tid, __u64 *ts) { return py_tstates.update(tid, ts); }
static __always_inline struct py_frame_buf *py_frame_buf_lookup(int *zero) { return py_frame_buf.lookup(zero); }
static __always_inline struct open_path *opening_lookup(__u32 *tid) { return opening.lookup(tid); }
static __always_inline int opening_update(__u32 *tid, struct open_path *p) { return opening.update(tid, p); }
static __always_inline int opening_delete(__u32 *tid) { return opening.delete(tid); }
static __always_inline struct open_path *scratch_lookup(int *zero) { return scratch.lookup(zero); }
static __always_inline struct slot_call *slot_arg_lookup(int *zero) { return slot_arg.lookup(zero); }
static __always_inline void tails_call(struct pt_regs *ctx, int tail) { tails.call(ctx, tail); }

/* --- concerns, each using only what the ones above it define ---------------------------- */
#include "calls/counters.bpf.h"
#include "calls/process.bpf.h"
#include "calls/library_open.bpf.h"
#include "calls/frames.bpf.h"
#include "calls/sampling.bpf.h"
#include "calls/call_stats.bpf.h"
#include "calls/pystack.bpf.h"
#include "calls/emit.bpf.h"
#include "calls/unwind.bpf.h"
#include "calls/python.bpf.h"
#include "calls/entry_return.bpf.h"
#include "calls/slots.bpf.h"

/* --- programs: the names the agent attaches, and fills `tails` with ---------------------- */
TRACEPOINT_PROBE(sched, sched_process_exit) { return thread_exited(); }
TRACEPOINT_PROBE(sched, sched_process_exec) { return program_executed(); }
#if defined(EACGM_FILTER_PIDS) && defined(EACGM_FOLLOW_FORKS)
TRACEPOINT_PROBE(sched, sched_process_fork) { return forked(&args->child_pid); }
#endif
#if defined(EACGM_FILTER_PIDS) && defined(EACGM_FOLLOW_FORKS) && defined(EACGM_HOLD_FORKS)
TRACEPOINT_PROBE(task, task_newtask) { return fork_noted(&args->pid, &args->clone_flags); }
TRACEPOINT_PROBE(syscalls, sys_exit_clone) { return fork_returned(); }
TRACEPOINT_PROBE(syscalls, sys_exit_clone3) { return fork_returned(); }
TRACEPOINT_PROBE(syscalls, sys_exit_fork) { return fork_returned(); }
#endif
TRACEPOINT_PROBE(syscalls, sys_enter_openat) { return open_entered(&args->filename); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat) { return open_exited(&args->ret); }

/* The common programs, tails[TAIL_ENTRY], tails[TAIL_RETURN] and tails[TAIL_UNWIND]: the
 * slot programs below and multi_probe tail-call them with the slot in `slot_arg`. */
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

int unwind(struct pt_regs *ctx)
{
	return pop_unwound(ctx);
}

/* CPython's function__entry / function__return USDT probes (also tails[TAIL_PY_ENTRY] and
 * tails[TAIL_PY_RETURN], where `unwind` continues an interrupted Python probe). */
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

/* With uprobe_multi links (kernel 6.6+, otel_eacgm/uprobe_multi.py) this one program serves
 * every probe: each offset's cookie names its slot (low 32 bits) and the common program to run
 * (high 32 bits, an eacgm_tail), so one link can hold any number of probes of one file. */
int multi_probe(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	return to_slot(ctx, (__u32)cookie, (int)(cookie >> 32));
}

/* entry_N / return_N for N < EACGM_PROBE_SLOTS (calls/slots.bpf.h). */
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
