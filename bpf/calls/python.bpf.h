/* Python functions, from CPython's function__entry/function__return USDT probes. Their entry
 * shares on_entry (entry_return.bpf.h) with the other layers; here are what only Python needs:
 * reading the USDT arguments, the agent's include/exclude rules, and the return match. */
#ifndef EACGM_CALLS_PYTHON_BPF_H
#define EACGM_CALLS_PYTHON_BPF_H

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
	struct py_scratch *s = py_scratch_lookup(&zero);
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
				__u64 *bits = py_names_lookup(&comp);
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
		struct py_rule *rule = py_rules_lookup(&key);
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
	struct py_call_event *ev = events_reserve(sizeof(struct py_call_event));
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
	events_submit(ev);
}

/* function__return: pops the thread's top frame only when it is this function's frame (same
 * file and name strings); a return of a function that was not traced changes nothing. */
static __always_inline int on_py_return(struct pt_regs *ctx, __u32 probe_id, struct probe_conf *conf,
					__u32 tgid, __u32 tid)
{
	if (!traced(tgid))
		return 0;
	__u32 *dp = depths_lookup(&tid);
	if (!dp || *dp == 0 || *dp > EACGM_MAX_DEPTH)
		return 0;
	check_unwound(ctx, tid, *dp, 0, TAIL_PY_RETURN);
	__u32 depth = *dp - 1;
	struct frame_key key = {.tid = tid, .depth = depth};
	struct frame *f = inflight_lookup(&key);
	if (!f || f->probe_id != probe_id || f->args[0] != usdt_arg(ctx, conf->usdt_reg[0]) ||
	    f->args[1] != usdt_arg(ctx, conf->usdt_reg[1]))
		return 0;
	if (f->repeats) {
		f->repeats--;
		return 0;
	}
	if (depth == 0)
		depths_delete(&tid);
	else
		*dp = depth;
	struct sample_conf *sc = sampling();
	__u64 now = bpf_ktime_get_ns();
	int fresh = account(sc, conf, f, tgid, 0, now - f->entry_ns, 1, 1);
	if (to_send(sc, conf, f, 0, now - f->entry_ns, fresh)) {
		emit_py(f, tgid, tid, depth, now);
		keep_parent(tid, depth);
	}
	inflight_delete(&key);
	return 0;
}

#endif
