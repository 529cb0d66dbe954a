/* Library discovery: a traced process opening one of the watched libraries wakes the agent at
 * once (it then reads /proc/PID/maps), instead of waiting for the next periodic scan. Prefixes
 * mirror otel_eacgm/probes/libraries.py. With EACGM_GATE_OPENS the process also stops until
 * the agent has attached to the library (it sends SIGCONT), so no early call goes untraced. */
#ifndef EACGM_CALLS_LIBRARY_OPEN_BPF_H
#define EACGM_CALLS_LIBRARY_OPEN_BPF_H

#define SIGSTOP_NUM 19

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

/* openat's entry: remember a watched library's name until the call's exit says it opened.
 * Every openat on the machine comes here, and nearly all return at once, so the handlers take
 * the address of the tracepoint's field and read it only on the path that needs it. */
static __always_inline int open_entered(const char *const *filename)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!traced(tgid) && !joined_cgroup(tgid))
		return 0;
	int zero = 0;
	struct open_path *p = scratch_lookup(&zero);
	if (!p)
		return 0;
	if (bpf_probe_read_user_str(p->path, sizeof(p->path), *filename) <= 0)
		return 0;
	if (watched_library(p))
		opening_update(&tid, p);
	return 0;
}

static __always_inline int open_exited(const long *ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct open_path *p = opening_lookup(&tid);
	if (!p)
		return 0;
	if (*ret >= 0) {
		struct lib_open_event *ev = events_reserve(sizeof(struct lib_open_event));
		if (ev) {
			ev->type = EACGM_EVENT_LIB_OPEN;
			ev->gated = 0;
			ev->pid = tgid;
			bpf_probe_read_kernel(ev->path, sizeof(ev->path), p->path);
#ifdef EACGM_GATE_OPENS
			if (may_hold()) {
				__u8 one = 1;
				held_update(&tgid, &one);  /* before the stop: whoever finds it there may continue it */
				if (bpf_send_signal(SIGSTOP_NUM) == 0)
					ev->gated = 1;
				else
					held_delete(&tgid);
			}
#endif
			events_submit(ev);
		} else {
			count(STAT_RINGBUF_DROPS);
		}
	}
	opening_delete(&tid);
	return 0;
}

#endif
