// Four threads block in libc, each under its own three-level call chain,
// until the main thread has run for argv[1] milliseconds. Built by the
// tests with and without frame pointers.
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
// Keeps a call from becoming a tail jump, which would drop the caller.
#define KEEP() asm volatile("" ::: "memory")

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int pipefd[2], epfd;
static volatile int done;

NOINLINE void cond_c(void) {
	pthread_mutex_lock(&mu);
	pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	KEEP();
}
NOINLINE void cond_b(void) { cond_c(); KEEP(); }
NOINLINE void cond_a(void) { cond_b(); KEEP(); }

NOINLINE void sleep_c(void) {
	struct timespec ts = {0, 3000000};
	nanosleep(&ts, NULL);
	KEEP();
}
NOINLINE void sleep_b(void) { sleep_c(); KEEP(); }
NOINLINE void sleep_a(void) { sleep_b(); KEEP(); }

NOINLINE void read_c(void) {
	char c;
	if (read(pipefd[0], &c, 1) < 0) abort();
	KEEP();
}
NOINLINE void read_b(void) { read_c(); KEEP(); }
NOINLINE void read_a(void) { read_b(); KEEP(); }

NOINLINE void epoll_c(void) {
	struct epoll_event ev;
	epoll_wait(epfd, &ev, 1, 3);
	KEEP();
}
NOINLINE void epoll_b(void) { epoll_c(); KEEP(); }
NOINLINE void epoll_a(void) { epoll_b(); KEEP(); }

static void *run_cond(void *a) { while (!done) cond_a(); return a; }
static void *run_sleep(void *a) { while (!done) sleep_a(); return a; }
static void *run_read(void *a) { while (!done) read_a(); return a; }
static void *run_epoll(void *a) { while (!done) epoll_a(); return a; }

int main(int argc, char **argv) {
	long ms = argc > 1 ? atol(argv[1]) : 2000;
	if (pipe(pipefd) || (epfd = epoll_create1(0)) < 0) return 1;
	/* With a second argument, the timed part waits for SIGUSR1: a
	 * recorder that attaches by pid cannot miss it however slow it is. */
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &usr1, NULL);
	pthread_t t[4];
	void *(*fn[4])(void *) = {run_cond, run_sleep, run_read, run_epoll};
	for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, fn[i], NULL);
	int sig;
	if (argc > 2 && sigwait(&usr1, &sig)) return 1;
	for (long i = 0; i < ms / 5; i++) {
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&mu);
		pthread_cond_signal(&cv);
		pthread_mutex_unlock(&mu);
		if (write(pipefd[1], "x", 1) != 1) return 1;
	}
	done = 1;
	pthread_mutex_lock(&mu);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	if (write(pipefd[1], "x", 1) != 1) return 1;
	for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
	return 0;
}
