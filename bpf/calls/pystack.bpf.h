/* Python frames above a traced call, read from the interpreter's own frame chain (no USDT, no
 * profile function): the thread's PyThreadState is found in the interpreter's thread list by
 * its native thread id (3.11+) or its pthread_self, i.e. the task's fs base (3.10), and cached
 * per thread; from its current frame the walk follows `previous` (f_back) up to the layout's
 * max_frames, recording each frame's code object and instruction offset. The agent resolves
 * code objects to names (otel_eacgm/pyframes/) and turns the frames into spans.
 *
 * Only outermost traced calls that are sent walk (emit.bpf.h): the frames of the calls under
 * them are the same, and a call not sent needs no frames. Every read is a checked user read of
 * a running process: a torn chain (a frame popped mid-walk) ends the walk with a fault status,
 * never a wrong frame; names are checked against the code object again in user space. */
#ifndef EACGM_CALLS_PYSTACK_BPF_H
#define EACGM_CALLS_PYSTACK_BPF_H

#define EACGM_PY_THREADS 128 /* thread states searched per interpreter */

static __always_inline __u64 py_read_ptr(__u64 addr)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
		return 0;
	return v;
}

/* What the interpreter calls this thread: its native id, or pthread_self (the fs base; its
 * offset in task_struct comes from the running kernel's BTF, not from the headers BCC has). */
static __always_inline __u64 py_thread_key(struct py_layout *l, __u32 tid)
{
	if (!l->match_fs)
		return tid;
	char *task = (char *)bpf_get_current_task();
	__u64 fs = 0;
	if (!l->task_fsbase || bpf_probe_read_kernel(&fs, sizeof(fs), task + l->task_fsbase) != 0)
		return 0;
	return fs;
}

/* The thread's PyThreadState, 0 if it has none (a thread Python never ran on). */
static __always_inline __u64 py_thread_state(struct py_layout *l, __u32 tid)
{
	__u64 want = py_thread_key(l, tid);
	if (!want)
		return 0;
	__u64 *cached = py_tstates_lookup(&tid);
	if (cached && *cached && py_read_ptr(*cached + l->ts_id) == want)
		return *cached;
	__u64 interp = py_read_ptr(l->runtime + l->interp_head);
	if (!interp)
		return 0;
	__u64 ts = py_read_ptr(interp + l->threads_head);
	for (int i = 0; i < EACGM_PY_THREADS; i++) {
		if (!ts)
			return 0;
		if (py_read_ptr(ts + l->ts_id) == want) {
			py_tstates_update(&tid, &ts);
			return ts;
		}
		ts = py_read_ptr(ts + l->ts_next);
	}
	return 0;
}

/* The frames of the thread `tid` of `tgid`, sent as a py_stack_event for `call_id`, if the
 * process runs an interpreter the agent gave a layout for. */
static __always_inline void send_py_stack(__u32 tgid, __u32 tid, __u64 call_id)
{
	struct py_layout *l = py_layouts_lookup(&tgid);
	if (!l)
		return;
	int zero = 0;
	struct py_frame_buf *buf = py_frame_buf_lookup(&zero);
	if (!buf)
		return;
	struct py_stack_event *ev = events_reserve(sizeof(struct py_stack_event));
	if (!ev) {
		count(STAT_RINGBUF_DROPS);
		return;
	}
	ev->type = EACGM_EVENT_PY_STACK;
	ev->status = EACGM_PY_WALK_NO_THREAD;
	ev->count = 0;
	ev->pid = tgid;
	ev->tid = tid;
	ev->pad0 = 0;
	ev->call_id = call_id;
	__u64 ts = py_thread_state(l, tid);
	if (!ts) {
		events_submit(ev);
		return;
	}
	__u64 frame = py_read_ptr(ts + l->ts_frame);
	if (frame && l->cframe_frame != EACGM_PY_NONE)
		frame = py_read_ptr(frame + l->cframe_frame);
	__u32 max = l->max_frames < EACGM_PY_FRAMES ? l->max_frames : EACGM_PY_FRAMES;
	__u32 size = l->fr_size > sizeof(buf->b) ? sizeof(buf->b) : l->fr_size;
	__u32 off_back = l->fr_back & 0x78, off_code = l->fr_code & 0x78;
	__u32 off_instr = l->fr_instr & 0x78, off_lasti = l->fr_instr & 0x7c, off_owner = l->fr_owner & 0x7f;
	__u32 off_first = l->co_firstlineno;
	__u64 co_code = l->co_code;
	__u8 status = EACGM_PY_WALK_DONE;
	int n = 0;
	for (int i = 0; i < EACGM_PY_FRAMES; i++) {
		if (!frame)
			break;
		if (i >= max)
			break;
		if (size == 0 || bpf_probe_read_user(buf->b, size, (void *)frame) != 0) {
			status = EACGM_PY_WALK_FAULT;
			break;
		}
		__u64 code = *(__u64 *)(buf->b + off_code);
		__u64 back = *(__u64 *)(buf->b + off_back);
		if (l->tagged)
			code &= ~7ULL;
		struct py_frame *out = &ev->frames[i & (EACGM_PY_FRAMES - 1)];
		out->code = 0;
		out->instr = 0;
		out->firstlineno = 0;
		/* owner 3 (C stack) and up: frames the interpreter keeps for itself, no code */
		if (l->fr_owner == EACGM_PY_NONE || buf->b[off_owner] < 3) {
			__s32 first = 0;
			if (!code || bpf_probe_read_user(&first, sizeof(first), (void *)(code + off_first)) != 0) {
				status = EACGM_PY_WALK_FAULT;
				break;
			}
			__u64 instr;
			if (l->lasti) {
				__s32 lasti = *(__s32 *)(buf->b + off_lasti);
				instr = lasti > 0 ? (__u64)lasti * 2 : 0;
			} else {
				instr = *(__u64 *)(buf->b + off_instr) - code - co_code;
			}
			out->code = code;
			out->instr = (__u32)instr;
			out->firstlineno = first;
		}
		n = i + 1;
		frame = back;
	}
	ev->status = status == EACGM_PY_WALK_DONE && frame ? EACGM_PY_WALK_DEEP : status;
	ev->count = n;
	events_submit(ev);
}

#endif
