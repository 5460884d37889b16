// A short-lived program with a known off-CPU time in its own code: it
// sleeps argv[1] microseconds (default 2000) in nap_here, then exits.
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void nap_here(long us) {
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, NULL);
	__asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
	nap_here(argc > 1 ? atol(argv[1]) : 2000);
	return 0;
}
