// Two threads bounce a byte over two pipes: every hand-off is a context
// switch. Prints the wall time in ns.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ab[2], ba[2];
static long rounds;

static void *pong(void *arg) {
	char c;
	for (long i = 0; i < rounds; i++) {
		if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) exit(1);
	}
	return arg;
}

int main(int argc, char **argv) {
	rounds = argc > 1 ? atol(argv[1]) : 400000;
	if (pipe(ab) || pipe(ba)) return 1;
	pthread_t t;
	struct timespec s, e;
	clock_gettime(CLOCK_MONOTONIC, &s);
	pthread_create(&t, NULL, pong, NULL);
	char c = 'x';
	for (long i = 0; i < rounds; i++) {
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
	}
	pthread_join(t, NULL);
	clock_gettime(CLOCK_MONOTONIC, &e);
	printf("%ld\n", (e.tv_sec - s.tv_sec) * 1000000000L + (e.tv_nsec - s.tv_nsec));
	return 0;
}
