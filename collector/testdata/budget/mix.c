// Short and long waits side by side: two threads bounce a byte over pipes
// (waits of a few µs, in two places) while a third sleeps 2 ms at a time
// in a function of its own. Usage: mix ROUNDS NAPS [PACE [LINGER]]; it
// starts once a byte arrives on its standard input (recorders attach in
// between). PACE: at most this many rounds a second (two switches each),
// held by sleeping to a deadline every millisecond; 0 or none: as fast as
// it can. LINGER 1: when done, prints "done" and waits for its standard
// input to close (recorders stop while it is blocked).
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ab[2], ba[2];
static long rounds, naps, pace;

static void *pong(void *arg) {
	char c;
	for (long i = 0; i < rounds; i++)
		if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) exit(1);
	return arg;
}

__attribute__((noinline)) static void long_naps(void) {
	struct timespec ts = {0, 2000000};
	for (long i = 0; i < naps; i++) nanosleep(&ts, NULL);
}

static void *napper(void *arg) {
	long_naps();
	return arg;
}

int main(int argc, char **argv) {
	rounds = argc > 1 ? atol(argv[1]) : 100000;
	naps = argc > 2 ? atol(argv[2]) : 200;
	pace = argc > 3 ? atol(argv[3]) : 0;
	int linger = argc > 4 && atoi(argv[4]) == 1;
	long per_ms = pace >= 1000 ? pace / 1000 : 0;
	char go;
	if (read(0, &go, 1) != 1) return 1;
	if (pipe(ab) || pipe(ba)) return 1;
	pthread_t p, n;
	pthread_create(&n, NULL, napper, NULL);
	pthread_create(&p, NULL, pong, NULL);
	char c = 'x';
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < rounds; i++) {
		if (per_ms && i % per_ms == 0) {
			long long ns = t0.tv_nsec + (long long)(i / per_ms) * 1000000;
			struct timespec at = {t0.tv_sec + ns / 1000000000, ns % 1000000000};
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
		}
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
	}
	pthread_join(p, NULL);
	pthread_join(n, NULL);
	if (linger) {
		write(1, "done\n", 5);
		while (read(0, &go, 1) > 0)
			;
	}
	return 0;
}
