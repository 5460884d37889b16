// chain DEPTH HOLD_MS MS: a wait chain of known shape. Thread DEPTH
// ("chain-root") holds lock DEPTH while it sleeps HOLD_MS, then rests 1 ms
// without it; thread i < DEPTH ("chain-w" and a letter) takes lock i, then
// lock i+1 (waiting on thread i+1, which holds it while it waits on thread
// i+2, ...), lets both go and rests 1 ms. So every waiter's wait ends,
// DEPTH - i hops away, in the root's sleep. Runs for MS milliseconds.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t locks[8];
static int depth, hold_ms;
static volatile int stop;

static void sleep_ms(int ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&t, 0);
}

static void *run(void *arg)
{
	long i = (long)arg;
	char name[16];
	if (i == depth)
		snprintf(name, sizeof name, "chain-root");
	else
		snprintf(name, sizeof name, "chain-w%c", (char)('a' + i - 1));
	pthread_setname_np(pthread_self(), name);
	while (!stop) {
		pthread_mutex_lock(&locks[i]);
		if (i == depth) {
			sleep_ms(hold_ms);
			pthread_mutex_unlock(&locks[i]);
			sleep_ms(1);
			continue;
		}
		pthread_mutex_lock(&locks[i + 1]);
		pthread_mutex_unlock(&locks[i + 1]);
		pthread_mutex_unlock(&locks[i]);
		sleep_ms(1);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	depth = atoi(argv[1]);
	hold_ms = atoi(argv[2]);
	int ms = atoi(argv[3]);
	if (depth < 1 || depth > 7)
		return 2;
	pthread_t t[8];
	for (int i = 1; i <= depth; i++)
		pthread_mutex_init(&locks[i], 0);
	for (long i = depth; i >= 1; i--)
		pthread_create(&t[i], 0, run, (void *)i);
	sleep_ms(ms);
	stop = 1;
	for (int i = 1; i <= depth; i++)
		pthread_join(t[i], 0);
	return 0;
}
