/* Three threads that each sleep 40 times 5 ms once the process gets
 * SIGUSR1, for TestTraceContextMap: the test puts their trace context in
 * otel_traces_ctx_v1, as the OpenTelemetry eBPF Instrumentation does for
 * a thread serving a request. Prints its threads' ids when they exist. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t ready, go;

static void *sleeper(void *arg)
{
	(void)arg;
	printf("%d\n", gettid());
	fflush(stdout);
	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);
	struct timespec ts = { 0, 5000000 };
	for (int i = 0; i < 40; i++)
		nanosleep(&ts, 0);
	return 0;
}

int main(void)
{
	sigset_t set;
	int sig;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, 0);
	pthread_barrier_init(&ready, 0, 4);
	pthread_barrier_init(&go, 0, 4);
	pthread_t t[3];
	for (int i = 0; i < 3; i++)
		pthread_create(&t[i], 0, sleeper, 0);
	pthread_barrier_wait(&ready);
	printf("ready\n");
	fflush(stdout);
	sigwait(&set, &sig);
	pthread_barrier_wait(&go);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], 0);
	return 0;
}
