// libcwaits MS: glibc's waits, each in a thread of its own, for MS
// milliseconds: "lock-a" and "lock-b" contend on a mutex each holds 2 ms;
// "pool-1" and "pool-2" wait on a condition for tasks "submit" hands
// them every 10 ms; "timed" waits on a condition with a 5 ms timeout;
// "pipe-rd" reads a pipe "pipe-wr" writes every 10 ms.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static int tasks, pipefd[2];
static volatile int stop;

static void spin_ms(int ms)
{
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while (!stop && (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}

static void sleep_ms(int ms)
{
	struct timespec t = {0, ms * 1000000L};
	nanosleep(&t, 0);
}

static void *locker(void *arg)
{
	pthread_setname_np(pthread_self(), arg);
	while (!stop) {
		pthread_mutex_lock(&lock);
		spin_ms(2);
		pthread_mutex_unlock(&lock);
		sleep_ms(1);
	}
	return 0;
}

static void *pool(void *arg)
{
	pthread_setname_np(pthread_self(), arg);
	pthread_mutex_lock(&qlock);
	while (!stop) {
		while (!tasks && !stop)
			pthread_cond_wait(&qcond, &qlock);
		if (tasks)
			tasks--;
	}
	pthread_mutex_unlock(&qlock);
	return 0;
}

static void *submit(void *arg)
{
	pthread_setname_np(pthread_self(), arg);
	while (!stop) {
		sleep_ms(10);
		pthread_mutex_lock(&qlock);
		tasks++;
		pthread_cond_signal(&qcond);
		pthread_mutex_unlock(&qlock);
	}
	pthread_mutex_lock(&qlock);
	pthread_cond_broadcast(&qcond);
	pthread_mutex_unlock(&qlock);
	return 0;
}

static void *timed(void *arg)
{
	pthread_setname_np(pthread_self(), arg);
	pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&m);
	while (!stop) {
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_nsec += 5000000;
		if (t.tv_nsec >= 1000000000) {
			t.tv_sec++;
			t.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&never, &m, &t);
	}
	pthread_mutex_unlock(&m);
	return 0;
}

static void *pipe_rd(void *arg)
{
	pthread_setname_np(pthread_self(), arg);
	char c;
	while (read(pipefd[0], &c, 1) == 1 && !stop)
		;
	return 0;
}

static void *pipe_wr(void *arg)
{
	pthread_setname_np(pthread_self(), arg);
	while (!stop) {
		sleep_ms(10);
		if (write(pipefd[1], "x", 1) != 1)
			break;
	}
	close(pipefd[1]);
	return 0;
}

int main(int argc, char **argv)
{
	int ms = argc > 1 ? atoi(argv[1]) : 3000;
	if (pipe(pipefd))
		return 1;
	struct {
		void *(*fn)(void *);
		char *name;
	} ts[] = {{locker, "lock-a"}, {locker, "lock-b"}, {pool, "pool-1"}, {pool, "pool-2"},
		  {submit, "submit"}, {timed, "timed"}, {pipe_rd, "pipe-rd"}, {pipe_wr, "pipe-wr"}};
	pthread_t th[8];
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], 0, ts[i].fn, ts[i].name);
	sleep_ms(0);
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&t, 0);
	stop = 1;
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], 0);
	return 0;
}
