/* Entry and return matching for every layer. An entry pushes a frame on its thread's stack
 * (parented by the frame below it, sampled, its arguments read); a return pops the top frame
 * when it is this probe's, counts the call and sends it if it is to be sent. Entry-only probes
 * (kernel launches) are counted and sent at once. Python returns: python.bpf.h. */
#ifndef EACGM_CALLS_ENTRY_RETURN_BPF_H
#define EACGM_CALLS_ENTRY_RETURN_BPF_H

/* Two links of one probe run their programs back to back in one trap: a few microseconds. */
#define EACGM_DUPLICATE_ENTRY_NS 20000

/* `python` is a constant: the slot programs compile without the Python branch. */
static __always_inline int on_entry(struct pt_regs *ctx, __u32 probe_id, const int python)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid))
		return 0;
	int slot = python ? 0 : probe_id;
	struct probe_conf *conf = python ? py_conf_lookup(&slot) : probe_conf_lookup(&slot);
	if (!conf)
		return 0;

	struct frame f = {};
	__u32 *dp = depths_lookup(&tid);
	__u32 depth = dp ? *dp : 0;
	f.sp = PT_REGS_SP(ctx);
	if (!python && depth > 0 && depth <= EACGM_MAX_DEPTH) {
		/* The same entry hit twice in one trap: while a group is linked again without some
		 * probes (operator shedding), its old and new links overlap on the kept ones. A call
		 * of the same function at the same stack pointer microseconds later is that, not a
		 * new call (the stack check below would end the first as unwound). */
		struct frame_key top_key = {.tid = tid, .depth = depth - 1};
		struct frame *top = inflight_lookup(&top_key);
		if (top && top->probe_id == probe_id && top->sp == f.sp &&
		    bpf_ktime_get_ns() - top->entry_ns < EACGM_DUPLICATE_ENTRY_NS)
			return 0;
	}
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
			struct frame *top = inflight_lookup(&top_key);
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
		parent = inflight_lookup(&pk);
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
		if (inflight_update(&key, &f) != 0)
			count(STAT_INFLIGHT_FULL);
	} else {
		count(STAT_DEPTH_OVERFLOW);
	}
	__u32 next_depth = depth + 1;
	depths_update(&tid, &next_depth);
	return 0;
}

/* A return whose entry the guardrail did not let through: its entries are detached a tick
 * before its returns and attached again after them, so that every call is seen whole or not
 * at all, and the calls made in between return with no frame of theirs. cycle_gap is 1 while
 * the guardrail's cyclable probes are in that gap, 2 while every probe is (the pause cycle). */
static __always_inline int in_cycle_gap(struct probe_conf *conf)
{
	int zero = 0;
	__u32 *gap = cycle_gap_lookup(&zero);
	return gap && (*gap == 2 || (*gap == 1 && conf->cyclable));
}

static __always_inline int on_return(struct pt_regs *ctx, __u32 probe_id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid))
		return 0;
	int slot = probe_id;
	struct probe_conf *conf = probe_conf_lookup(&slot);
	if (!conf)
		return 0;
	__u32 *dp = depths_lookup(&tid);
	if (!dp || *dp == 0) {
		count(in_cycle_gap(conf) ? STAT_CYCLED_RETURN : STAT_UNMATCHED_RETURN);
		return 0;
	}
	if (conf->exit_probes) {
		/* at a return instruction the stack pointer is the entry's again: frames below it
		 * were unwound, and a frame with another stack pointer is not this call's */
		check_unwound(ctx, tid, *dp, 1, TAIL_RETURN);
		struct frame_key top_key = {.tid = tid, .depth = *dp - 1};
		struct frame *top = *dp <= EACGM_MAX_DEPTH ? inflight_lookup(&top_key) : NULL;
		if (top && top->sp != PT_REGS_SP(ctx))
			return 0;
	} else if (in_cycle_gap(conf)) {
		/* a uretprobe with no frame of its own: the open frame is its caller's, left alone */
		struct frame_key top_key = {.tid = tid, .depth = *dp - 1};
		struct frame *top = *dp <= EACGM_MAX_DEPTH ? inflight_lookup(&top_key) : NULL;
		if (top && top->probe_id != probe_id) {
			count(STAT_CYCLED_RETURN);
			return 0;
		}
	}
	__u32 depth = *dp - 1;
	if (depth == 0)
		depths_delete(&tid);
	else
		*dp = depth;
	if (depth >= EACGM_MAX_DEPTH)
		return 0;

	struct frame_key key = {.tid = tid, .depth = depth};
	struct frame *f = inflight_lookup(&key);
	if (!f) {
		count(STAT_UNMATCHED_RETURN);
		return 0;
	}
	if (f->probe_id != probe_id) {
		count(STAT_MISMATCHED_RETURN);
		inflight_delete(&key);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	__s64 ret = PT_REGS_RC(ctx);
	__s32 status = conf->returns_status ? (__s32)ret : 0;
	struct sample_conf *sc = sampling();
	account(sc, conf, f, tgid, status, now - f->entry_ns, 1, 0);
	if (!to_send(sc, conf, f, status, now - f->entry_ns, 0)) {
		inflight_delete(&key);
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
	inflight_delete(&key);
	return 0;
}

#endif
