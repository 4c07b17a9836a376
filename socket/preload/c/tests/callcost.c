/* callcost: what libbypassd adds to a call it passes through. It times
 * fcntl(F_GETFL) on a kernel socket the library does not offload (TCP),
 * alternating rounds through the symbol the program links (the library's,
 * when preloaded) and through libc's own fcntl, and prints the best round
 * of each in ns per call and their difference. Alternating rounds share
 * whatever load the machine has. Used by scripts/bench-preload.sh. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

typedef int (*fcntl_fn)(int, int, ...);

static double round_ns(fcntl_fn f, int fd, int n)
{
	double t0 = now_ns();
	for (int i = 0; i < n; i++)
		if (f(fd, F_GETFL) < 0)
			return -1;
	return (now_ns() - t0) / n;
}

int main(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	fcntl_fn direct = libc ? (fcntl_fn)dlsym(libc, "fcntl") : NULL;
	if (fd < 0 || !direct)
		return 1;
	enum { ROUNDS = 2000, N = 500 };
	double best_linked = 1e18, best_direct = 1e18;
	for (int r = 0; r < ROUNDS; r++) {
		double a = round_ns(fcntl, fd, N), b = round_ns(direct, fd, N);
		if (a < 0 || b < 0)
			return 1;
		if (a < best_linked)
			best_linked = a;
		if (b < best_direct)
			best_direct = b;
	}
	printf("linked %.1f ns, libc %.1f ns, added %.1f ns\n", best_linked, best_direct,
	       best_linked - best_direct);
	return 0;
}
