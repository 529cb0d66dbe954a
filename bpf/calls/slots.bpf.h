/* Probe slots. Each catalog row gets a slot N: the agent attaches entry_N / return_N (or
 * multi_probe with N in the cookie) and writes the row's settings into probe_conf[N]. The slot
 * programs share one copy of the entry and return code: each stores its number and tail-calls
 * the common program, so a slot costs a few instructions to compile and verify (BCC has no
 * BPF-to-BPF calls). A tail call keeps the CPU, so the per-CPU `slot_arg` cell is the common
 * program's argument. The programs themselves are pasted in calls.bpf.c (see there why). */
#ifndef EACGM_CALLS_SLOTS_BPF_H
#define EACGM_CALLS_SLOTS_BPF_H

static __always_inline int to_slot(struct pt_regs *ctx, __u32 n, int tail)
{
	int zero = 0;
	struct slot_call *call = slot_arg_lookup(&zero);
	if (!call)
		return 0;
	call->slot = n;
	tails_call(ctx, tail);
	return 0; /* not reached unless the common programs are missing */
}

#define EACGM_PROBE_PAIR(n)                                                    \
	int entry_##n(struct pt_regs *ctx) { return to_slot(ctx, n, TAIL_ENTRY); } \
	int return_##n(struct pt_regs *ctx) { return to_slot(ctx, n, TAIL_RETURN); }
/* Slots t0..t9. Slots 0..9 are pasted without a tens digit (an empty t), so that no slot is an
 * octal literal such as 08. */
#define EACGM_PROBE_TEN(t)                                                     \
	EACGM_PROBE_PAIR(t##0) EACGM_PROBE_PAIR(t##1) EACGM_PROBE_PAIR(t##2)   \
	EACGM_PROBE_PAIR(t##3) EACGM_PROBE_PAIR(t##4) EACGM_PROBE_PAIR(t##5)   \
	EACGM_PROBE_PAIR(t##6) EACGM_PROBE_PAIR(t##7) EACGM_PROBE_PAIR(t##8)   \
	EACGM_PROBE_PAIR(t##9)

#endif
