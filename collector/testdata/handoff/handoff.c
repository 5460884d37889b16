// handoff N DELAY_US CPU_US [OUT]: a request chain of known shape, timed by its
// own clocks. Thread "req" hands each of N requests to thread "worker"
// (an eventfd) and waits for its answer (another); the worker spins
// CPU_US, asks process "backend" over a socket, spins CPU_US again and
// answers. The backend sleeps DELAY_US (the injected delay) before it
// replies. Prints (to OUT if given) one JSON object per request with
// every step's CLOCK_MONOTONIC ns (the clock of bpf_ktime_get_ns) and
// the threads' ids.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct times {
	uint64_t start, end;           /* req: handed over, answer read */
	uint64_t w_got, w_ask, w_reply, w_done; /* worker */
	uint64_t b_sleep, b_woke;      /* backend: around its sleep */
	int b_tid;
};

static int to_worker, to_req, sock[2], n, delay_us, cpu_us, worker_tid;
static struct times *T;

static uint64_t now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void spin(int us)
{
	uint64_t end = now() + (uint64_t)us * 1000;
	while (now() < end)
		;
}

static void backend(void)
{
	prctl(PR_SET_NAME, "backend");
	close(sock[0]);
	uint64_t reply[3];
	char c;
	while (read(sock[1], &c, 1) == 1) {
		struct timespec d = {delay_us / 1000000, (delay_us % 1000000) * 1000L};
		reply[0] = now();
		nanosleep(&d, 0);
		reply[1] = now();
		reply[2] = syscall(SYS_gettid);
		if (write(sock[1], reply, sizeof reply) != sizeof reply)
			break;
	}
	_exit(0);
}

static void *worker(void *arg)
{
	pthread_setname_np(pthread_self(), "worker");
	worker_tid = syscall(SYS_gettid);
	uint64_t v, reply[3];
	for (int i = 0; i < n; i++) {
		if (read(to_worker, &v, 8) != 8)
			exit(1);
		T[i].w_got = now();
		spin(cpu_us);
		T[i].w_ask = now();
		if (write(sock[0], "q", 1) != 1 || read(sock[0], reply, sizeof reply) != sizeof reply)
			exit(1);
		T[i].w_reply = now();
		T[i].b_sleep = reply[0];
		T[i].b_woke = reply[1];
		T[i].b_tid = (int)reply[2];
		spin(cpu_us);
		T[i].w_done = now();
		v = 1;
		if (write(to_req, &v, 8) != 8)
			exit(1);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: handoff N DELAY_US CPU_US [OUT]\n");
		return 2;
	}
	n = atoi(argv[1]);
	delay_us = atoi(argv[2]);
	cpu_us = atoi(argv[3]);
	T = calloc(n, sizeof *T);
	to_worker = eventfd(0, 0);
	to_req = eventfd(0, 0);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sock))
		return 1;
	pid_t child = fork();
	if (child == 0)
		backend();
	close(sock[1]);
	pthread_setname_np(pthread_self(), "req");
	pthread_t w;
	pthread_create(&w, 0, worker, 0);
	int req_tid = syscall(SYS_gettid);
	uint64_t v = 1;
	for (int i = 0; i < n; i++) {
		T[i].start = now();
		if (write(to_worker, &v, 8) != 8 || read(to_req, &v, 8) != 8)
			return 1;
		T[i].end = now();
		struct timespec gap = {0, 1000000};
		nanosleep(&gap, 0);
	}
	pthread_join(w, 0);
	close(sock[0]);
	waitpid(child, 0, 0);
	FILE *out = argc == 5 ? fopen(argv[4], "w") : stdout;
	if (!out)
		return 1;
	for (int i = 0; i < n; i++)
		fprintf(out, "{\"i\":%d,\"req_tid\":%d,\"worker_tid\":%d,\"backend_pid\":%d,\"backend_tid\":%d,\"start\":%llu,\"end\":%llu,"
		       "\"w_got\":%llu,\"w_ask\":%llu,\"w_reply\":%llu,\"w_done\":%llu,\"b_sleep\":%llu,\"b_woke\":%llu}\n",
		       i, req_tid, worker_tid, child, T[i].b_tid, (unsigned long long)T[i].start, (unsigned long long)T[i].end,
		       (unsigned long long)T[i].w_got, (unsigned long long)T[i].w_ask, (unsigned long long)T[i].w_reply,
		       (unsigned long long)T[i].w_done, (unsigned long long)T[i].b_sleep, (unsigned long long)T[i].b_woke);
	return fclose(out) != 0;
}
