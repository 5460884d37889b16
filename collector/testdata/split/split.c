// Threads that spin 2 ms and sleep 3 ms in turn, so each has time on a
// CPU, waiting for one (beside CPU hogs) and blocked. They start when a
// byte arrives on standard input, work SECONDS, then wait (alive, idle)
// until the process is killed; the main thread waits for them. Usage:
// split SECONDS THREADS; prints "ready" once they exist.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double secs;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int started;

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *work(void *arg) {
	pthread_mutex_lock(&mu);
	while (!started) pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	double end = now() + secs;
	struct timespec nap = {0, 3000000};
	while (now() < end) {
		double until = now() + 0.002;
		while (now() < until)
			;
		nanosleep(&nap, NULL);
	}
	pthread_mutex_lock(&mu);
	while (started) pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return arg;
}

int main(int argc, char **argv) {
	secs = argc > 1 ? atof(argv[1]) : 1;
	int n = argc > 2 ? atoi(argv[2]) : 2;
	if (n < 1 || n > 16) return 2;
	pthread_t t[16];
	for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, work, NULL);
	printf("ready\n");
	fflush(stdout);
	char c;
	if (read(0, &c, 1) != 1) return 1;
	pthread_mutex_lock(&mu);
	started = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
	return 0;
}
