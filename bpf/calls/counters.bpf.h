/* The agent's self-telemetry: what the BPF side lost or left out, by enum eacgm_stat. */
#ifndef EACGM_CALLS_COUNTERS_BPF_H
#define EACGM_CALLS_COUNTERS_BPF_H

static __always_inline void count(int stat)
{
	int key = stat;
	__u64 *v = stats_lookup(&key);
	if (v)
		__sync_fetch_and_add(v, 1);
}

#endif
