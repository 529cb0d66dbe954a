/* A workload for the reliability tests and benchmarks/soak.py: real libcudart and libnccl
 * calls (they fail fast without a GPU, with real error codes) at a steady, paced rate.
 *
 * usage: reliability_calls LIBCUDART LIBNCCL rate CALLS_PER_S SECONDS
 *            SECONDS 0: until SIGTERM/SIGINT. Each tick is one cudaLaunchKernel (an entry-only
 *            probe) and, every fourth tick, ncclGroupStart + ncclGroupEnd (entry+return probes).
 *        reliability_calls LIBCUDART LIBNCCL dlclose CYCLES CALLS
 *            per cycle: dlopen libcudart, CALLS launches, dlclose, and whether it is unmapped.
 * Environment: RELIABILITY_START_FILE: start calling once this file exists (the libraries are
 * loaded already, so an agent started with --pid finds them).
 * Output, one JSON line each: {"ready": ..., "launch_addr": ...} once loaded, then the totals
 * ({"launch": N, "group": M, "calls": N + 2M}), or one line per dlclose cycle. Sleeps between
 * ticks (clock_nanosleep) instead of spinning: the machine's cores are shared with the agent.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*void_fn)(void);

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void wait_start_file(void)
{
	const char *path = getenv("RELIABILITY_START_FILE");
	while (path && access(path, F_OK) != 0 && !stop)
		usleep(5000);
}

static int mapped(const char *path)
{
	char line[4096];
	int found = 0;
	FILE *maps = fopen("/proc/self/maps", "r");
	while (maps && fgets(line, sizeof(line), maps))
		found |= strstr(line, path) != NULL;
	if (maps)
		fclose(maps);
	return found;
}

static void *open_or_die(const char *path)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen %s failed: %s\n", path, dlerror());
		exit(1);
	}
	return h;
}

static int paced(const char *cudart, const char *nccl_path, double rate, double seconds)
{
	void *rt = open_or_die(cudart), *nccl = open_or_die(nccl_path);
	launch_fn launch = (launch_fn)dlsym(rt, "cudaLaunchKernel");
	void_fn gstart = (void_fn)dlsym(nccl, "ncclGroupStart"), gend = (void_fn)dlsym(nccl, "ncclGroupEnd");
	/* A readable host address that is no kernel stub: fails cleanly with or without a GPU. */
	const void *stub = dlsym(rt, "cudaGetErrorName");
	dim3 g = {1, 1, 1}, b = {32, 1, 1};
	printf("{\"ready\": true, \"pid\": %d, \"launch_addr\": \"%p\", \"group_start_addr\": \"%p\"}\n", getpid(),
	       (void *)launch, (void *)gstart);
	fflush(stdout);
	wait_start_file();
	long launches = 0, groups = 0;
	const long per_ms = rate >= 1000 ? (long)(rate / 1000) : 1;
	const long tick_ns = rate >= 1000 ? 1000000 : (long)(1e9 / rate);
	struct timespec next, begin;
	clock_gettime(CLOCK_MONOTONIC, &begin);
	next = begin;
	while (!stop) {
		for (long i = 0; i < per_ms; i++) {
			launch(stub, g, b, NULL, 0, NULL);
			if (launches++ % 4 == 0) {
				gstart();
				gend();
				groups++;
			}
		}
		next.tv_nsec += tick_ns;
		while (next.tv_nsec >= 1000000000) {
			next.tv_nsec -= 1000000000;
			next.tv_sec++;
		}
		if (seconds > 0 && (next.tv_sec - begin.tv_sec) + (next.tv_nsec - begin.tv_nsec) / 1e9 >= seconds)
			break;
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	printf("{\"launch\": %ld, \"group\": %ld, \"calls\": %ld}\n", launches, groups, launches + 2 * groups);
	return 0;
}

static int cycles(const char *cudart, int n_cycles, long calls)
{
	dim3 g = {1, 1, 1}, b = {32, 1, 1};
	printf("{\"ready\": true, \"pid\": %d}\n", getpid());
	fflush(stdout);
	wait_start_file();
	for (int c = 0; c < n_cycles; c++) {
		void *rt = open_or_die(cudart);
		launch_fn launch = (launch_fn)dlsym(rt, "cudaLaunchKernel");
		const void *stub = dlsym(rt, "cudaGetErrorName");
		for (long i = 0; i < calls; i++)
			launch(stub, g, b, NULL, 0, NULL);
		int closed = dlclose(rt);
		printf("{\"cycle\": %d, \"calls\": %ld, \"dlclose\": %d, \"unmapped\": %s}\n", c, calls, closed,
		       mapped(cudart) ? "false" : "true");
		fflush(stdout);
		usleep(200000); /* the agent rescans on the next open; give it a moment between cycles */
	}
	return 0;
}

int main(int argc, char **argv)
{
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	if (argc == 6 && strcmp(argv[3], "rate") == 0)
		return paced(argv[1], argv[2], atof(argv[4]), atof(argv[5]));
	if (argc == 6 && strcmp(argv[3], "dlclose") == 0)
		return cycles(argv[1], atoi(argv[4]), atol(argv[5]));
	fprintf(stderr, "usage: %s LIBCUDART LIBNCCL rate CALLS_PER_S SECONDS | dlclose CYCLES CALLS\n", argv[0]);
	return 2;
}
