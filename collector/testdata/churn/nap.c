// A short-lived program with a known off-CPU time in its own code: it
// sleeps argv[1] microseconds (default 2000) in nap_here, then exits.
// With NAP_LOG set, it appends the sleep's wall time in ns, measured
// around the call with CLOCK_MONOTONIC, to that file: the truth the
// recorded time is checked against.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) void nap_here(long us) {
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, NULL);
	__asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
	long long t0 = now();
	nap_here(argc > 1 ? atol(argv[1]) : 2000);
	long long t1 = now();
	const char *log = getenv("NAP_LOG");
	if (log) {
		char line[32];
		int n = snprintf(line, sizeof(line), "%lld\n", t1 - t0);
		int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
		if (fd >= 0) {
			write(fd, line, n); /* one write: lines do not interleave */
			close(fd);
		}
	}
	return 0;
}
