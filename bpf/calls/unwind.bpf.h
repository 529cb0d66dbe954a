/* Frames that a C++ exception unwound: their return instructions never ran. A frame is gone
 * when the stack pointer is back above its entry stack pointer (the stack grows down; at a
 * return instruction, back at it), which the thread's next entry or return shows. Only frames
 * of exit-probed functions can be left so (uretprobes see every return, Python returns come
 * from the interpreter). The check is one lookup; the rare cleanup runs in its own program
 * (tail call `unwind`, which then continues with the interrupted program) to keep each
 * program's verification small. */
#ifndef EACGM_CALLS_UNWIND_BPF_H
#define EACGM_CALLS_UNWIND_BPF_H

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
	struct frame *top = inflight_lookup(&key);
	if (!top || !stale(top, PT_REGS_SP(ctx), at_return))
		return;
	int zero = 0;
	struct slot_call *call = slot_arg_lookup(&zero);
	if (!call)
		return;
	call->cont = cont;
	tails_call(ctx, TAIL_UNWIND);
}

/* The `unwind` program: reports the thread's stale top frame as unwound and pops it. */
static __always_inline int pop_unwound(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	int zero = 0;
	struct slot_call *call = slot_arg_lookup(&zero);
	if (!call)
		return 0;
	__u32 *dp = depths_lookup(&tid);
	int at_return = call->cont == TAIL_RETURN || call->cont == TAIL_PY_RETURN;
	__u32 depth = dp ? *dp : 0;
	struct frame_key key = {.tid = tid, .depth = depth - 1};
	struct frame *top = dp && depth > 0 && depth <= EACGM_MAX_DEPTH ? inflight_lookup(&key) : NULL;
	if (dp && top && stale(top, PT_REGS_SP(ctx), at_return)) {
		/* one frame per pass; the program calls itself for the next (the kernel bounds the
		 * chain at 33 tail calls, far more than exception-unwound operator frames) */
		int slot = top->probe_id;
		struct probe_conf *conf = probe_conf_lookup(&slot);
		if (conf)
			account(sampling(), conf, top, tgid, EACGM_STATUS_UNWOUND, 0, 0, 0);
		emit(top, tgid, tid, depth - 1, EACGM_FLAG_UNWOUND, bpf_ktime_get_ns(), 0, 0, -1);
		keep_parent(tid, depth - 1);
		inflight_delete(&key);
		if (depth == 1)
			depths_delete(&tid);
		else
			*dp = depth - 1;
		tails_call(ctx, TAIL_UNWIND);
	}
	tails_call(ctx, call->cont);
	return 0;
}

#endif
