// Launches short-lived processes: argv[1] per second for argv[2] seconds,
// each running argv[3..] (fork + execv), and reaps them as they exit.
// Prints how many it started and how many exited with status 0.
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int ok;

static void reap(int flags) {
	int st;
	pid_t p;
	while ((p = waitpid(-1, &st, flags)) > 0)
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			ok++;
}

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: churn PER_SECOND SECONDS PROGRAM [ARG...]\n");
		return 2;
	}
	double rate = atof(argv[1]), secs = atof(argv[2]);
	long long gap = (long long)(1e9 / rate), start = now(), end = start + (long long)(secs * 1e9);
	long long next = start;
	int started = 0;
	while (next < end) {
		pid_t p = fork();
		if (p == 0) {
			execv(argv[3], argv + 3);
			_exit(127);
		}
		if (p > 0)
			started++;
		reap(WNOHANG);
		next += gap;
		long long d = next - now();
		if (d > 0) {
			struct timespec ts = {d / 1000000000LL, d % 1000000000LL};
			clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
		}
	}
	reap(0);
	printf("%d %d\n", started, ok);
	return 0;
}
