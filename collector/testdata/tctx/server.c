/* A threaded server that publishes OpenTelemetry thread context (OTEP
 * 4947) and process context (OTEP 4719), for TestThreadContext. Each
 * worker serves requests, each under its own trace and span with an
 * http.route and a tenant attribute; a request waits on a mutex held by
 * another thread, on a downstream thread over a pipe, or in a sleep, and
 * measures its own time off a CPU (wall time less the thread's CPU time).
 * Built with -DTCTX_LIB, the variable lives in a library it dlopens
 * (dynamic TLS, TLSDESC); otherwise in the executable (static TLS).
 *
 * usage: server SECONDS REPORT [LIBRARY]
 * REPORT: one line per request: span_id route off_cpu_ns. With
 * TCTX_WAIT set, it waits for SIGUSR1 before serving (a recorder that
 * attaches by pid misses none of its requests). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "record.h"

#define WORKERS 4
#define MAX_REQ 20000

static void (*publish)(struct tctx_record *);

#ifndef TCTX_LIB
__attribute__((visibility("default"))) __thread struct tctx_record *otel_thread_ctx_v1;
static void publish_here(struct tctx_record *r)
{
	atomic_signal_fence(memory_order_seq_cst);
	otel_thread_ctx_v1 = r;
	atomic_signal_fence(memory_order_seq_cst);
}
#endif

static const char *routes[] = { "/lock", "/downstream", "/sleep" };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stop;

struct done {
	uint64_t span;
	int route;
	int64_t off_ns; /* signed: clocks that disagree read below zero */
};
static struct done done[MAX_REQ];
static atomic_int ndone;

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, 0);
}

/* Holds the lock 2 ms out of every 3. */
static void *holder(void *arg)
{
	(void)arg;
	while (!stop) {
		pthread_mutex_lock(&lock);
		sleep_us(2000);
		pthread_mutex_unlock(&lock);
		sleep_us(1000);
	}
	return 0;
}

/* A downstream service: answers each byte after 1-3 ms. */
struct pipes {
	int req[2], resp[2];
};
static void *downstream(void *arg)
{
	struct pipes *p = arg;
	char c;
	unsigned seed = 7;
	while (read(p->req[0], &c, 1) == 1) {
		sleep_us(1000 + rand_r(&seed) % 2000);
		if (write(p->resp[1], &c, 1) != 1)
			break;
	}
	return 0;
}

static void put_attr(struct tctx_record *r, uint8_t key, const char *val)
{
	uint8_t n = strlen(val);
	r->attrs[r->attrs_size] = key;
	r->attrs[r->attrs_size + 1] = n;
	memcpy(r->attrs + r->attrs_size + 2, val, n);
	r->attrs_size += 2 + n;
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	struct pipes p;
	pthread_t ds;
	if (pipe(p.req) || pipe(p.resp))
		abort();
	pthread_create(&ds, 0, downstream, &p);
	struct tctx_record *rec = calloc(1, sizeof(*rec));
	unsigned seed = id + 1;
	for (uint64_t n = 1; !stop; n++) {
		int route = rand_r(&seed) % 3;
		uint64_t span = ((uint64_t)(id + 1) << 48) | n;
		char tenant[16];
		snprintf(tenant, sizeof(tenant), "tenant-%d", (int)(n % 5));
		/* A fixed record per thread: valid 0 while it changes. */
		rec->valid = 0;
		atomic_signal_fence(memory_order_seq_cst);
		/* Sequential ids, as hex prints them: they differ in their last
		 * bytes only. */
		memset(rec->trace_id, 0, 16);
		rec->trace_id[0] = 0xab;
		for (int i = 0; i < 8; i++) {
			rec->trace_id[8 + i] = span >> (56 - 8 * i);
			rec->span_id[i] = span >> (56 - 8 * i);
		}
		rec->trace_flags = 1;
		rec->attrs_size = 0;
		put_attr(rec, 0, routes[route]);
		put_attr(rec, 1, tenant);
		atomic_signal_fence(memory_order_seq_cst);
		rec->valid = 1;
		/* The clocks read outside the record's publication, in this order:
		 * a preemption between a clock and the record, or at the CPU
		 * clock's system call, falls in neither measure. */
		uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
		uint64_t w0 = clock_ns(CLOCK_MONOTONIC);
		publish(rec);
		for (int k = 0; k < 2; k++) {
			if (route == 0) {
				pthread_mutex_lock(&lock);
				pthread_mutex_unlock(&lock);
				sleep_us(300);
			} else if (route == 1) {
				char c = 'x';
				if (write(p.req[1], &c, 1) != 1 || read(p.resp[0], &c, 1) != 1)
					abort();
			} else {
				sleep_us(1000 + rand_r(&seed) % 3000);
			}
		}
		publish(0);
		uint64_t w1 = clock_ns(CLOCK_MONOTONIC);
		uint64_t c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
		int64_t off = (int64_t)(w1 - w0) - (int64_t)(c1 - c0);
		int i = atomic_fetch_add(&ndone, 1);
		if (i < MAX_REQ)
			done[i] = (struct done){ span, route, off };
		sleep_us(500); /* between requests: no context */
	}
	close(p.req[1]);
	pthread_join(ds, 0);
	return 0;
}

/* Varint and length-delimited protobuf fields. */
static size_t pb_varint(uint8_t *b, uint64_t v)
{
	size_t n = 0;
	do {
		b[n++] = (v & 0x7f) | (v > 0x7f ? 0x80 : 0);
		v >>= 7;
	} while (v);
	return n;
}
static size_t pb_bytes(uint8_t *b, int field, const void *v, size_t len)
{
	size_t n = pb_varint(b, (uint64_t)field << 3 | 2);
	n += pb_varint(b + n, len);
	memcpy(b + n, v, len);
	return n + len;
}
static size_t pb_string_value(uint8_t *b, const char *s) /* AnyValue{string_value} */
{
	uint8_t tmp[128];
	size_t n = pb_bytes(tmp, 1, s, strlen(s));
	memcpy(b, tmp, n);
	return n;
}

/* The process context: ProcessContext{extra_attributes = 2: the schema
 * version and the attribute key map}, behind the OTEL_CTX header. */
static void publish_process_context(void)
{
	uint8_t payload[512], kv[256], any[256], arr[256], tmp[128];
	size_t np = 0, nkv, nany, narr = 0, n;

	n = pb_string_value(tmp, "tls_v1");
	nkv = pb_bytes(kv, 1, "threadlocal.schema_version", 26);
	nkv += pb_bytes(kv + nkv, 2, tmp, n);
	np += pb_bytes(payload + np, 2, kv, nkv);

	const char *names[] = { "http.route", "tenant" };
	for (int i = 0; i < 2; i++) {
		n = pb_string_value(tmp, names[i]);
		narr += pb_bytes(arr + narr, 1, tmp, n);
	}
	nany = pb_bytes(any, 5, arr, narr);
	nkv = pb_bytes(kv, 1, "threadlocal.attribute_key_map", 29);
	nkv += pb_bytes(kv + nkv, 2, any, nany);
	np += pb_bytes(payload + np, 2, kv, nkv);

	int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, 4096))
		abort();
	uint8_t *m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED)
		abort();
	close(fd);
	memcpy(m + 32, payload, np);
	uint32_t version = 2, size = np;
	uint64_t at = clock_ns(CLOCK_REALTIME), ptr = (uint64_t)(m + 32);
	memcpy(m + 8, &version, 4);
	memcpy(m + 12, &size, 4);
	memcpy(m + 16, &at, 8);
	memcpy(m + 24, &ptr, 8);
	atomic_thread_fence(memory_order_seq_cst);
	memcpy(m, "OTEL_CTX", 8);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: server SECONDS REPORT [LIBRARY]\n");
		return 2;
	}
#ifdef TCTX_LIB
	if (argc < 4) {
		fprintf(stderr, "usage: server SECONDS REPORT LIBRARY\n");
		return 2;
	}
	void *h = dlopen(argv[3], RTLD_NOW);
	if (!h || !(publish = (void (*)(struct tctx_record *))dlsym(h, "tctx_publish"))) {
		fprintf(stderr, "dlopen %s: %s\n", argv[3], dlerror());
		return 1;
	}
#else
	publish = publish_here;
#endif
	publish_process_context();
	if (getenv("TCTX_WAIT")) {
		sigset_t set;
		int sig;
		sigemptyset(&set);
		sigaddset(&set, SIGUSR1);
		sigprocmask(SIG_BLOCK, &set, 0);
		sigwait(&set, &sig);
	}
	sleep_us(300000); /* let the recorder find the process */
	pthread_t hold, w[WORKERS];
	pthread_create(&hold, 0, holder, 0);
	for (int i = 0; i < WORKERS; i++)
		pthread_create(&w[i], 0, worker, (void *)(intptr_t)i);
	sleep_us(atof(argv[1]) * 1e6);
	stop = 1;
	for (int i = 0; i < WORKERS; i++)
		pthread_join(w[i], 0);
	pthread_join(hold, 0);
	FILE *f = fopen(argv[2], "w");
	if (!f)
		return 1;
	int nd = ndone < MAX_REQ ? ndone : MAX_REQ;
	for (int i = 0; i < nd; i++)
		fprintf(f, "%016llx %s %lld\n", (unsigned long long)done[i].span, routes[done[i].route],
			(long long)done[i].off_ns);
	fclose(f);
	return 0;
}
