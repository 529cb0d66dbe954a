/* Tight loops over real library calls, timed in-process, for probe_overhead.py.
 * usage: call_loop LIBCUDART LIBNCCL ITERATIONS [CALLS_PER_SECOND]
 * Prints one JSON line: ns per call for an entry-only probed call (cudaLaunchKernel) and for
 * an entry+return probed pair (ncclGroupStart + ncclGroupEnd, two calls). No GPU needed: the
 * calls fail fast with real error codes, so the figure is the probe cost plus the call itself.
 * With CALLS_PER_SECOND the launch loop is paced (batches of 100) to measure sustained capture.
 * usage: call_loop LIBCUDART LIBNCCL mixed K SECONDS
 * runs K launches and one ncclGroupStart + ncclGroupEnd pair per iteration, as fast as it can,
 * for SECONDS: a thread whose speed its probes set, with calls of both kinds interleaved.
 * usage: call_loop LIBCUDART LIBNCCL free N [CALLS_PER_SECOND]
 * makes N cudaFree calls on distinct made-up addresses (each fails with a real error code
 * without a GPU): the span-throughput load of agent_throughput.py, paced like the launch loop.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*void_fn)(void);

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int mixed(launch_fn launch, void_fn gstart, void_fn gend, const void *stub, long k, double seconds)
{
	dim3 g = {1, 1, 1}, b = {32, 1, 1};
	long iterations = 0;
	double t0 = now_ns(), end = t0 + seconds * 1e9, t = t0;
	while (t < end) {
		for (long i = 0; i < k; i++)
			launch(stub, g, b, NULL, 0, NULL);
		gstart();
		gend();
		iterations++;
		t = now_ns();
	}
	printf("{\"iteration_ns\": %.1f, \"iterations\": %ld, \"launches\": %ld}\n", (t - t0) / iterations,
	       iterations, iterations * k);
	return 0;
}

typedef int (*free_fn)(void *);

static int frees(free_fn cuda_free, long n, double rate)
{
	double t0 = now_ns();
	for (long i = 0; i < n; i++) {
		cuda_free((void *)(uintptr_t)(0x7f0000000000 + i * 256));
		if (rate > 0 && i % 100 == 99) {
			double due = t0 + (i + 1) * 1e9 / rate;
			while (now_ns() < due)
				;
		}
	}
	printf("{\"free_ns\": %.1f, \"calls\": %ld}\n", (now_ns() - t0) / n, n);
	return 0;
}

int main(int argc, char **argv)
{
	int is_mixed = argc == 6 && argv[3][0] == 'm';
	int is_free = (argc == 5 || argc == 6) && argv[3][0] == 'f';
	if (argc != 4 && argc != 5 && !is_mixed && !is_free) {
		fprintf(stderr, "usage: %s LIBCUDART LIBNCCL ITERATIONS [CALLS_PER_SECOND]\n"
			"       %s LIBCUDART LIBNCCL mixed K SECONDS\n"
			"       %s LIBCUDART LIBNCCL free N [CALLS_PER_SECOND]\n", argv[0], argv[0], argv[0]);
		return 2;
	}
	void *rt = dlopen(argv[1], RTLD_NOW), *nccl = dlopen(argv[2], RTLD_NOW);
	if (!rt || !nccl) {
		fprintf(stderr, "dlopen failed: %s\n", dlerror());
		return 1;
	}
	if (is_free)
		return frees((free_fn)dlsym(rt, "cudaFree"), atol(argv[4]), argc == 6 ? atof(argv[5]) : 0);
	launch_fn launch = (launch_fn)dlsym(rt, "cudaLaunchKernel");
	void_fn gstart = (void_fn)dlsym(nccl, "ncclGroupStart"), gend = (void_fn)dlsym(nccl, "ncclGroupEnd");
	long n = atol(argv[3]);
	dim3 g = {1, 1, 1}, b = {32, 1, 1};
	/* A real, readable host address that is no registered kernel stub: the runtime answers
	 * cudaErrorInvalidDeviceFunction on a GPU (a made-up pointer crashes it there) and
	 * cudaErrorInsufficientDriver without one. */
	const void *stub = dlsym(rt, "cudaGetErrorName");
	launch(stub, g, b, NULL, 0, NULL); /* first call initialises the runtime */
	if (is_mixed)
		return mixed(launch, gstart, gend, stub, atol(argv[4]), atof(argv[5]));
	double rate = argc == 5 ? atof(argv[4]) : 0;
	double t0 = now_ns();
	for (long i = 0; i < n; i++) {
		launch(stub, g, b, NULL, 0, NULL);
		if (rate > 0 && i % 100 == 99) {
			double due = t0 + (i + 1) * 1e9 / rate;
			while (now_ns() < due)
				;
		}
	}
	double t1 = now_ns();
	for (long i = 0; rate == 0 && i < n; i++) { /* paced runs measure launches only */
		gstart();
		gend();
	}
	double t2 = now_ns();
	printf("{\"launch_ns\": %.1f, \"group_pair_ns\": %.1f, \"iterations\": %ld}\n", (t1 - t0) / n, (t2 - t1) / n, n);
	return 0;
}
