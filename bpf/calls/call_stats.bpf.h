/* Call statistics: every call is counted here (count, failures by return code, a log2 duration
 * histogram, NCCL bytes and bandwidth), so the agent's statistics cover all calls at any
 * sampling ratio and whatever the ring buffer lost; only calls that become spans cross the
 * ring buffer. otel_eacgm/metrics/call_stats.py reads `call_stats`. */
#ifndef EACGM_CALLS_CALL_STATS_BPF_H
#define EACGM_CALLS_CALL_STATS_BPF_H

static __always_inline __u64 nccl_type_size(__u64 dtype)
{
	switch ((__u32)dtype) {
	case 0: case 1: case 10: case 11: return 1;      /* int8, uint8, float8e4m3, float8e5m2 */
	case 6: case 9: return 2;                         /* float16, bfloat16 */
	case 2: case 3: case 7: return 4;                 /* int32, uint32, float32 */
	case 4: case 5: case 8: return 8;                 /* int64, uint64, float64 */
	}
	return 0;
}

/* Python calls are counted per function: their file, function name and line (the interpreter's
 * string addresses are stable for a code object). otel_eacgm/metrics/call_stats.py mirrors it. */
static __always_inline __u64 py_key(__u64 *args)
{
	return args[0] ^ (args[1] * 0x9E3779B97F4A7C15ULL) ^ ((args[2] & 0xffffffffULL) << 32);
}

static __always_inline __u32 log2_bucket(__u64 v, int shift)
{
	__u32 b = v ? bpf_log2l(v) : 0;
	b = b > shift ? b - shift : 0;
	return b & 31;
}

/* Counts one call; returns 1 when it opened a new statistics entry. */
static __always_inline int account(struct sample_conf *sc, struct probe_conf *conf, struct frame *f, __u32 tgid,
				   __s32 status, __u64 dur_ns, int timed, const int python)
{
	if (!sc || !sc->stats_on)
		return 0;
	struct stat_key key = {};
	key.pid = tgid;
	key.probe_id = f->probe_id;
	key.status = status;
	int k = conf->key_arg;
	if (python)
		key.key = py_key(f->args);
	else if (k >= 0 && k < EACGM_MAX_ARGS)
		key.key = f->args[k];
	int fresh = 0;
	struct call_stat *st = call_stats_lookup(&key);
	if (!st) {
		int zero = 0;
		struct call_stat *z = stat_zero_lookup(&zero);
		if (!z)
			return 0;
		fresh = call_stats_insert(&key, z) == 0;
		st = call_stats_lookup(&key);
		if (!st) {
			count(STAT_STATS_FULL);
			return 0;
		}
	}
	__sync_fetch_and_add(&st->count, 1);
	if (timed) {
		__sync_fetch_and_add(&st->timed, 1);
		__sync_fetch_and_add(&st->sum_ns, dur_ns);
		__sync_fetch_and_add(&st->dur[log2_bucket(dur_ns, EACGM_DUR_SHIFT)], 1);
	}
	int c = conf->count_arg, d = conf->dtype_arg;
	if (c >= 0 && c < EACGM_MAX_ARGS && d >= 0 && d < EACGM_MAX_ARGS) {
		__u64 bytes = f->args[c] * nccl_type_size(f->args[d]);
		__sync_fetch_and_add(&st->bytes, bytes);
		if (timed && status == 0 && bytes && dur_ns) {
			/* bytes * 1e9 stays below 2^64 up to 16 GiB */
			__u64 bw = bytes < (1ULL << 34) ? bytes * 1000000000ULL / dur_ns : bytes / dur_ns * 1000000000ULL;
			__sync_fetch_and_add(&st->bw_sum, bw);
			__sync_fetch_and_add(&st->bw_count, 1);
			__sync_fetch_and_add(&st->bw[log2_bucket(bw, EACGM_BW_SHIFT)], 1);
		}
	}
	return fresh;
}

#endif
