/* Which calls become spans. Sampling is decided at a call's entry (so that a subtree is sent
 * whole or not at all) by thread and time slice, the unit the agent groups outermost calls in;
 * at its return a call outside the sample is still sent when it failed, was slow, or is the
 * ancestor of a sent call. Settings come from the agent in sample_conf[0]. */
#ifndef EACGM_CALLS_SAMPLING_BPF_H
#define EACGM_CALLS_SAMPLING_BPF_H

static __always_inline __u64 mix64(__u64 x)
{
	x += 0x9E3779B97F4A7C15ULL;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

static __always_inline struct sample_conf *sampling(void)
{
	int zero = 0;
	return sample_conf_lookup(&zero);
}

/* Counts one sampled call against its thread's slice; 0 when the slice has used its cap (a
 * child of a sampled call is never refused: subtrees stay whole, and count). A launch-bound
 * thread makes 100k+ calls a second: one sampled second of it would overflow the ring buffer,
 * so past the cap the slice's calls are counted in the statistics and not sent. */
static __always_inline int spend(struct sample_conf *sc, __u32 tid, __u64 now, int child)
{
	if (!sc->slice_max || !sc->slice_ns)
		return 1;
	__u64 slice = now / sc->slice_ns;
	struct slice_count *c = slice_counts_lookup(&tid);
	if (!c || c->slice != slice) {
		struct slice_count fresh = {.slice = slice, .sent = 1};
		slice_counts_update(&tid, &fresh);
		return 1;
	}
	if (c->sent >= sc->slice_max && !child)
		return 0;
	c->sent++;
	return 1;
}

/* Whether a call entered at `now` is in the span sample. Calls follow their parent, unless
 * they start long after it (a main() open for hours: its steps are decided one by one); the
 * others are decided per thread and time slice, the unit the agent groups outermost calls in. */
static __always_inline int in_sample(struct sample_conf *sc, struct frame *parent, __u32 tid, __u64 now,
				     __u64 call_id)
{
	if (!sc || sc->ratio >= 65536)
		return 1;
	if (parent && now - parent->entry_ns < sc->resample_ns)
		return (parent->flags & EACGM_FLAG_SAMPLED) && spend(sc, tid, now, 1);
	if (!sc->ratio)
		return 0;
	__u64 x = sc->slice_ns ? (((__u64)tid << 32) ^ (now / sc->slice_ns)) : call_id;
	return (mix64(x ^ sc->salt) & 0xffff) < sc->ratio && spend(sc, tid, now, 0);
}

/* Whether a completed call is sent to the agent; counts the ones that are not. */
static __always_inline int to_send(struct sample_conf *sc, struct probe_conf *conf, struct frame *f, __s32 status,
				   __u64 dur_ns, int fresh)
{
	if ((f->flags & (EACGM_FLAG_SAMPLED | EACGM_FLAG_KEEP)) || status || conf->always_send || fresh ||
	    (sc && dur_ns >= sc->slow_ns)) {
		return 1;
	}
	count(STAT_SAMPLED_OUT);
	return 0;
}

#endif
