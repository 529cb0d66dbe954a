/* Which processes are traced, and what their lifecycle tells the agent: a thread that exits
 * with calls open, a process that executes another program, a child of a traced process. */
#ifndef EACGM_CALLS_PROCESS_BPF_H
#define EACGM_CALLS_PROCESS_BPF_H

/* Whether a process may be stopped for the agent (a gated open, a held fork): not once the
 * agent is ending (CallProgram.stop_holding), when no one would send it SIGCONT. */
static __always_inline int may_hold(void)
{
	int zero = 0;
	__u32 *off = holds_off_lookup(&zero);
	return !off || !*off;
}

static __always_inline int traced(__u32 tgid)
{
	if (tgid == EACGM_AGENT_PID)
		return 0;
#ifdef EACGM_FILTER_PIDS
	return targets_lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

/* EACGM_CGROUP_ID: a process that joined the traced cgroup after the agent's last scan (a
 * `docker exec`, a `systemd-run` into the scope) is no target yet; it becomes one here, where
 * the library-open watch asks, so its open is gated and linked like a target's. */
static __always_inline int joined_cgroup(__u32 tgid)
{
#if defined(EACGM_FILTER_PIDS) && defined(EACGM_CGROUP_ID)
	if (tgid != EACGM_AGENT_PID &&
	    bpf_get_current_ancestor_cgroup_id(EACGM_CGROUP_LEVEL) == (__u64)EACGM_CGROUP_ID) {
		__u8 one = 1;
		targets_update(&tgid, &one);
		return 1;
	}
#endif
	return 0;
}

/* Calls still open when their thread exits (the process was killed mid-call) must not vanish:
 * tell the agent how many frames the thread left in `inflight`; it reads them, reports them
 * as incomplete calls and frees them. */
static __always_inline int thread_exited(void)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	__u32 *dp = depths_lookup(&tid);
	if (dp) {
		struct thread_exit_event *ev = events_reserve(sizeof(*ev));
		if (ev) {
			ev->type = EACGM_EVENT_THREAD_EXIT;
			ev->pid = tgid;
			ev->tid = tid;
			ev->depth = *dp;
			ev->exit_ns = bpf_ktime_get_ns();
			events_submit(ev);
		} else {
			count(STAT_RINGBUF_DROPS);
		}
		depths_delete(&tid);
	}
#ifdef EACGM_FILTER_PIDS
	if (tgid == tid)
		targets_delete(&tgid);
#endif
#ifdef EACGM_HOLD_FORKS
	if (tgid == tid)
		fork_holds_delete(&tgid);  /* killed before it returned from the fork */
#endif
	return 0;
}

/* A process that executes another program keeps its pid but is then that program (a launched
 * command's waiter becoming the command, a wrapper script exec'ing python): the agent reads
 * its resource again. The tracepoint fires once the new image is set up, so /proc/PID shows
 * the new executable and environment. A lost event costs a stale name, not a call: it is not
 * counted as a ring-buffer drop. */
static __always_inline int program_executed(void)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
#ifdef EACGM_FILTER_PIDS
	if (!targets_lookup(&tgid))
		return 0;
#endif
	struct exec_event *ev = events_reserve(sizeof(*ev));
	if (ev) {
		ev->type = EACGM_EVENT_EXEC;
		ev->pad0[0] = ev->pad0[1] = ev->pad0[2] = 0;
		ev->pid = tgid;
		events_submit(ev);
	}
	return 0;
}

/* EACGM_FOLLOW_FORKS: a child of a traced process is traced from its first instruction.
 * child_pid points into the tracepoint's record (read only on the path that needs it). */
static __always_inline int forked(const int *child_pid)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (targets_lookup(&tgid)) {
		__u32 child = *child_pid;
		__u8 one = 1;
		targets_update(&child, &one);
	}
	return 0;
}

#define CLONE_VM_FLAG 0x100
#define SIGSTOP_SIGNAL 19

/* EACGM_HOLD_FORKS, part one (task_newtask, in the parent): a traced process is creating a
 * child with a memory of its own. With probes scoped to processes, the child inherits its
 * parent's breakpoints (the copied pages) but not its links: the kernel runs a link's program
 * only in the process it names, so every call the child makes before the agent has linked it
 * would trap and be lost. Threads and vfork children (CLONE_VM) share the parent's memory and
 * are not held: a thread is covered by its process's links, a vfork child executes or exits. */
static __always_inline int fork_noted(const int *child_pid, const __u64 *clone_flags)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!traced(tgid) || (*clone_flags & CLONE_VM_FLAG))
		return 0;
	__u32 child = *child_pid;
	__u8 one = 1;
	fork_holds_update(&child, &one);
	return 0;
}

/* EACGM_HOLD_FORKS, part two (sys_exit_clone/clone3/fork, in the child as it returns from the
 * fork, before its first instruction): stop it and tell the agent, which links the child's
 * libraries and sends SIGCONT. The parent's return from the same call finds no entry. A full
 * ring buffer leaves the child running (untraced until the next scan) rather than stopped for
 * good; the lost record counts as a ring-buffer drop. */
static __always_inline int fork_returned(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	if (!fork_holds_lookup(&tid))
		return 0;
	fork_holds_delete(&tid);
	struct exec_event *ev = events_reserve(sizeof(*ev));
	if (!ev) {
		count(STAT_RINGBUF_DROPS);
		return 0;
	}
	ev->type = EACGM_EVENT_FORK_HELD;
	ev->pad0[0] = ev->pad0[1] = ev->pad0[2] = 0;
	ev->pid = tid;
	if (may_hold()) {
		__u8 one = 1;
		held_update(&tid, &one);  /* before the stop: whoever finds it there may continue it */
		bpf_send_signal(SIGSTOP_SIGNAL);  /* if it fails, the agent links it all the same, running */
	}
	events_submit(ev);
	return 0;
}

#endif
