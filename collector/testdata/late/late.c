// Starts two threads after a delay (argv[1] milliseconds, or "-": after a
// line on stdin): late-nap blocks in 100 nanosleeps of 10 ms, late-futex in
// 200 futex waits of 5 ms that time out. Each prints its tid and its own
// off-CPU time: wall time from its first instruction to its last, less the
// CPU time the kernel gave it (CLOCK_THREAD_CPUTIME_ID), then the kernel's
// counts of its voluntary and involuntary context switches.
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long long ns(clockid_t c) {
	struct timespec ts;
	clock_gettime(c, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int word;

static void *run(void *arg) {
	int futex = arg != NULL;
	long long start = ns(CLOCK_MONOTONIC);
	pthread_setname_np(pthread_self(), futex ? "late-futex" : "late-nap");
	for (int i = 0; i < (futex ? 200 : 100); i++) {
		struct timespec ts = {0, futex ? 5000000 : 10000000};
		if (futex)
			syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
		else
			nanosleep(&ts, NULL);
	}
	long long off = ns(CLOCK_MONOTONIC) - start - ns(CLOCK_THREAD_CPUTIME_ID);
	// The kernel's own count of this thread's context switches so far.
	long vol = -1, invol = -1;
	char line[128];
	FILE *f = fopen("/proc/thread-self/status", "r");
	while (f && fgets(line, sizeof line, f)) {
		sscanf(line, "voluntary_ctxt_switches: %ld", &vol);
		sscanf(line, "nonvoluntary_ctxt_switches: %ld", &invol);
	}
	if (f) fclose(f);
	printf("%s %ld %lld %ld %ld\n", futex ? "late-futex" : "late-nap", (long)syscall(SYS_gettid), off, vol, invol);
	fflush(stdout);
	return NULL;
}

int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "-") == 0) {
		char line[16];
		if (!fgets(line, sizeof line, stdin)) return 1;
	} else {
		struct timespec ts = {0, (argc > 1 ? atol(argv[1]) : 300) * 1000000L};
		nanosleep(&ts, NULL);
	}
	pthread_t t[2];
	for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run, i ? &word : NULL);
	for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
	return 0;
}
