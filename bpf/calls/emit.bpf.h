/* A completed call out to the agent: one call_event, or a call_str_event when the catalog row
 * names a string argument (kernel or function name), on the `events` ring buffer. An
 * outermost call of a Python process is preceded by its Python frames (pystack.bpf.h). */
#ifndef EACGM_CALLS_EMIT_BPF_H
#define EACGM_CALLS_EMIT_BPF_H

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
	if (depth == 0 && f->probe_id != EACGM_PY_PROBE_ID)
		send_py_stack(tgid, tid, f->call_id);
	if (str_arg >= 0 && str_arg < EACGM_MAX_ARGS) {
		struct call_str_event *sev = events_reserve(sizeof(struct call_str_event));
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
		events_submit(sev);
		return;
	}
	struct call_event *ev = events_reserve(sizeof(struct call_event));
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
	events_submit(ev);
}

#endif
