/* The arm64 guests' sleep: glibc's sleep(3), linked static with its
 * symbols, for the tests that read a sleeping C program's frames (the
 * guests' busybox is stripped). Usage: sleep SECONDS */
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	unsigned left = (unsigned)strtoul(argv[1], NULL, 10);
	while (left > 0)
		left = sleep(left);
	return 0;
}
