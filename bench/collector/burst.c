/* A busy process with a 200 µs critical section every 5 s (docs/collector.md's
 * users' case): background() spins between bursts; critical_section()
 * spins 200 µs. Runs for argv[1] seconds (default 40). */
#include <stdlib.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin_until(double end)
{
	while (now() < end)
		;
}

__attribute__((noinline)) void critical_section(void)
{
	spin_until(now() + 200e-6);
}

__attribute__((noinline)) void background(double end)
{
	spin_until(end);
}

int main(int argc, char **argv)
{
	double stop = now() + (argc > 1 ? atof(argv[1]) : 40);
	double next = now() + 5;
	while (now() < stop) {
		background(next);
		critical_section();
		next += 5;
	}
	return 0;
}
