/*
 * CPU-bound workload for the overhead harness (bench/overhead).
 *
 * Built without frame pointers (run.sh: -O2 -fomit-frame-pointer
 * -fno-optimize-sibling-calls), so a profiler must unwind it from DWARF CFI.
 * The hot loop runs in leaf(), 30 distinct non-inlined functions below main
 * (f01 ... f30); every block of work makes one cheap system call so that
 * some samples also carry a kernel stack.
 *
 *   workload            run until SIGTERM or SIGINT
 *   workload SECONDS    run for SECONDS (fractions allowed), then exit
 *
 * On SIGUSR1 it writes one line to stdout: the number of blocks of work done
 * so far (the harness reads it at the start and the end of a measurement);
 * on exit it writes the final count the same way.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static volatile unsigned long blocks;

static void write_count(void)
{
	char buf[32];
	int i = sizeof(buf);
	unsigned long n = blocks;
	buf[--i] = '\n';
	do {
		buf[--i] = (char)('0' + n % 10);
		n /= 10;
	} while (n);
	ssize_t ignored = write(STDOUT_FILENO, buf + i, sizeof(buf) - i);
	(void)ignored;
}

static void on_usr1(int sig)
{
	(void)sig;
	write_count();
}

static void on_stop(int sig)
{
	(void)sig;
	stop = 1;
}

#define NOINLINE __attribute__((noinline))

/* One block of integer work (about a microsecond), then a system call. */
static NOINLINE unsigned long leaf(unsigned long seed)
{
	while (!stop) {
		unsigned long x = seed;
		for (int i = 0; i < 400; i++)
			x = x * 6364136223846793005UL + 1442695040888963407UL;
		seed ^= x;
		syscall(SYS_getppid);
		blocks++;
	}
	return seed;
}

/* Each level adds to its callee's result, so no call is a tail call. */
#define LEVEL(name, next)                                          \
	static NOINLINE unsigned long name(unsigned long seed)     \
	{                                                          \
		return next(seed + 1) + 1;                         \
	}

LEVEL(f30, leaf)
LEVEL(f29, f30)
LEVEL(f28, f29)
LEVEL(f27, f28)
LEVEL(f26, f27)
LEVEL(f25, f26)
LEVEL(f24, f25)
LEVEL(f23, f24)
LEVEL(f22, f23)
LEVEL(f21, f22)
LEVEL(f20, f21)
LEVEL(f19, f20)
LEVEL(f18, f19)
LEVEL(f17, f18)
LEVEL(f16, f17)
LEVEL(f15, f16)
LEVEL(f14, f15)
LEVEL(f13, f14)
LEVEL(f12, f13)
LEVEL(f11, f12)
LEVEL(f10, f11)
LEVEL(f09, f10)
LEVEL(f08, f09)
LEVEL(f07, f08)
LEVEL(f06, f07)
LEVEL(f05, f06)
LEVEL(f04, f05)
LEVEL(f03, f04)
LEVEL(f02, f03)
LEVEL(f01, f02)

int main(int argc, char **argv)
{
	struct sigaction sa = { 0 };
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGALRM, &sa, NULL);
	if (argc > 1) {
		double seconds = strtod(argv[1], NULL);
		struct itimerval t = { 0 };
		t.it_value.tv_sec = (long)seconds;
		t.it_value.tv_usec = (long)((seconds - (long)seconds) * 1e6);
		if (t.it_value.tv_sec == 0 && t.it_value.tv_usec == 0)
			t.it_value.tv_usec = 1;
		setitimer(ITIMER_REAL, &t, NULL);
	}
	unsigned long r = f01((unsigned long)getpid());
	write_count();
	return (int)(r & 1);
}
