/* poll and epoll for stream sockets: the events an eventfd cannot carry.
 *
 * The descriptor of an offloaded socket is its RX eventfd (sock.c), so the
 * kernel's multiplexers report it readable and writable correctly, and at
 * the end of a stream it stays readable (stream.c). What an eventfd never
 * reports is POLLRDHUP/EPOLLRDHUP (the peer's FIN), POLLHUP/EPOLLHUP (both
 * directions ended, or reset) and POLLERR/EPOLLERR (a pending socket
 * error). These wrappers call the real poll/ppoll/epoll_wait/epoll_pwait and
 * add them to what the kernel returned for an offloaded stream socket; the
 * kernel still does all the waiting. epoll_wait returns the program's
 * epoll_data, not descriptors, so epoll_ctl remembers which data names which
 * stream socket (only for offloaded stream sockets: other descriptors cost
 * nothing here but one counter load). A stream socket registered for
 * EPOLLRDHUP without EPOLLIN is registered with EPOLLIN in the kernel (the
 * eventfd becomes readable at the FIN) and EPOLLIN is taken out again.
 *
 * The flags come from what the receive path consumed: EPOLLRDHUP shows
 * once a read met the FIN (the eventfd is readable before that, since the
 * FIN is a record in the queue, so a program reading on EPOLLIN gets its
 * 0 as usual). select() is not interposed: readability is all it reports.
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "bpd.h"

#define EXPORT __attribute__((visibility("default")))

static int (*real_poll)(struct pollfd *, nfds_t, int);
static int (*real_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
static int (*real_epoll_ctl)(int, int, int, struct epoll_event *);
static int (*real_epoll_wait)(int, struct epoll_event *, int, int);
static int (*real_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);

static void *next(const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);
	if (!p)
		abort(); /* libc without it: nothing sensible to do */
	return p;
}

#define ENSURE(name)                                                                           \
	do {                                                                                   \
		if (!real_##name)                                                              \
			real_##name = next(#name);                                             \
	} while (0)

/* ---- poll ---- */

static void poll_fix(struct pollfd *p, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++) {
		if (!p[i].revents)
			continue;
		struct bpd_sock *s = bpd_fd_get(p[i].fd);
		if (!s)
			continue;
		uint32_t ev = bpd_stream_events(s);
		bpd_sock_unref(s);
		if (ev & EPOLLRDHUP && p[i].events & POLLRDHUP)
			p[i].revents |= POLLRDHUP;
		p[i].revents |= (short)(ev & (POLLHUP | POLLERR));
	}
}

EXPORT int poll(struct pollfd *p, nfds_t n, int timeout)
{
	ENSURE(poll);
	int r = real_poll(p, n, timeout);
	if (r > 0)
		poll_fix(p, n);
	return r;
}

EXPORT int ppoll(struct pollfd *p, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	ENSURE(ppoll);
	int r = real_ppoll(p, n, ts, mask);
	if (r > 0)
		poll_fix(p, n);
	return r;
}

/* ---- epoll ----
 * reg[] holds (epoll fd, descriptor, the program's data and events) of
 * every registration of an offloaded stream socket. */

struct reg {
	int epfd, fd;
	uint64_t data;
	uint32_t events;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct reg *reg;
static int nreg, capreg;
static _Atomic int anyreg; /* nreg > 0: close() and epoll_wait() look */

static int find(int epfd, int fd)
{
	for (int i = 0; i < nreg; i++)
		if (reg[i].epfd == epfd && reg[i].fd == fd)
			return i;
	return -1;
}

static void drop(int i)
{
	reg[i] = reg[--nreg];
	atomic_store(&anyreg, nreg > 0);
}

void bpd_mux_closed(int fd)
{
	if (!atomic_load(&anyreg))
		return;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nreg;)
		if (reg[i].fd == fd || reg[i].epfd == fd)
			drop(i);
		else
			i++;
	pthread_mutex_unlock(&mu);
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	ENSURE(epoll_ctl);
	if (op == EPOLL_CTL_DEL) {
		int r = real_epoll_ctl(epfd, op, fd, ev);
		if (r == 0 && atomic_load(&anyreg)) {
			pthread_mutex_lock(&mu);
			int i = find(epfd, fd);
			if (i >= 0)
				drop(i);
			pthread_mutex_unlock(&mu);
		}
		return r;
	}
	struct bpd_sock *s = ev ? bpd_fd_get(fd) : NULL;
	int stream = s && s->state == BPD_OFFLOADED && s->type == SOCK_STREAM;
	if (s)
		bpd_sock_unref(s);
	if (!stream)
		return real_epoll_ctl(epfd, op, fd, ev);
	struct epoll_event k = *ev;
	if (k.events & EPOLLRDHUP)
		k.events |= EPOLLIN;
	int r = real_epoll_ctl(epfd, op, fd, &k);
	if (r)
		return r;
	pthread_mutex_lock(&mu);
	int i = find(epfd, fd);
	if (i < 0 && nreg == capreg) {
		int c = capreg ? capreg * 2 : 64;
		struct reg *n = realloc(reg, (size_t)c * sizeof(*n));
		if (n) {
			reg = n;
			capreg = c;
		}
	}
	if (i < 0 && nreg < capreg)
		i = nreg++;
	if (i >= 0)
		reg[i] = (struct reg){epfd, fd, ev->data.u64, ev->events};
	atomic_store(&anyreg, nreg > 0);
	pthread_mutex_unlock(&mu);
	return 0;
}

static void epoll_fix(int epfd, struct epoll_event *ev, int n)
{
	if (!atomic_load(&anyreg))
		return;
	for (int i = 0; i < n; i++) {
		int fd = -1;
		uint32_t want = 0;
		pthread_mutex_lock(&mu);
		for (int j = 0; j < nreg; j++)
			if (reg[j].epfd == epfd && reg[j].data == ev[i].data.u64) {
				fd = reg[j].fd;
				want = reg[j].events;
				break;
			}
		pthread_mutex_unlock(&mu);
		struct bpd_sock *s = fd >= 0 ? bpd_fd_get(fd) : NULL;
		if (!s)
			continue;
		uint32_t add = bpd_stream_events(s);
		bpd_sock_unref(s);
		ev[i].events |= add & ((want & (EPOLLIN | EPOLLRDHUP)) | EPOLLHUP | EPOLLERR);
		if (!(want & EPOLLIN))
			ev[i].events &= ~(uint32_t)EPOLLIN; /* added for EPOLLRDHUP's sake */
	}
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	ENSURE(epoll_wait);
	int r = real_epoll_wait(epfd, ev, max, timeout);
	if (r > 0)
		epoll_fix(epfd, ev, r);
	return r;
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout, const sigset_t *mask)
{
	ENSURE(epoll_pwait);
	int r = real_epoll_pwait(epfd, ev, max, timeout, mask);
	if (r > 0)
		epoll_fix(epfd, ev, r);
	return r;
}
