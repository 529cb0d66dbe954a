/* In-flight frames: one stack per thread, shared by all layers, in `depths` (its height) and
 * `inflight` (its frames). A frame is pushed at a call's entry and popped at its return, so
 * the agent receives each call once, complete and already parented. */
#ifndef EACGM_CALLS_FRAMES_BPF_H
#define EACGM_CALLS_FRAMES_BPF_H

static __always_inline __u64 new_call_id(void)
{
	int zero = 0;
	__u64 *next = next_id_lookup(&zero);
	if (!next)
		return 0;
	return __sync_fetch_and_add(next, 1) + 1;
}

/* A sent call's parent is sent too (KEEP), so that no span arrives without its ancestors. */
static __always_inline void keep_parent(__u32 tid, __u32 depth)
{
	if (depth == 0 || depth > EACGM_MAX_DEPTH)
		return;
	struct frame_key pk = {.tid = tid, .depth = depth - 1};
	struct frame *parent = inflight_lookup(&pk);
	if (parent)
		parent->flags |= EACGM_FLAG_KEEP;
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

#endif
