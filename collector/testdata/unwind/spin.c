// Burns CPU under a three-level call chain for argv[1] rounds: the
// on-CPU sampler must walk it whole without frame pointers.
#include <stdlib.h>
#include <string.h>
#define NOINLINE __attribute__((noinline))
volatile unsigned long sink;
NOINLINE void spin_c(void) { char buf[4096]; for (int i = 0; i < 2000; i++) { memset(buf, i, sizeof buf); sink += buf[i % 4096]; } asm volatile(""); }
NOINLINE void spin_b(void) { spin_c(); asm volatile(""); }
NOINLINE void spin_a(void) { spin_b(); asm volatile(""); }
int main(int argc, char **argv) { long n = atol(argv[1]); for (long i = 0; i < n; i++) spin_a(); return 0; }
