/* The libc entry points libbypassd interposes, and the fd table.
 *
 * A UDP or TCP socket (AF_INET/AF_INET6, SOCK_DGRAM or SOCK_STREAM) is
 * created in the kernel as usual and tracked as "pending". Whether it is
 * offloaded is decided when the program first gives it an address: bind or
 * listen (the local address), connect, or the first send of an unbound UDP
 * socket (the remote address), against the rules (rules.c). Offloading opens the socket at bypassd and
 * dup3()s its RX eventfd over the program's descriptor, which closes the
 * kernel socket; a socket the rules leave to the kernel is forgotten and
 * every later call goes straight to libc. So an fd that is not in the table
 * costs one array load per intercepted call.
 *
 * poll, select and epoll do no translation: the descriptor of an offloaded
 * socket is an eventfd that is readable exactly while its receive queue
 * holds a record (sock.c), so the kernel's multiplexers work on it as they
 * are, mixed with any other descriptors, in every mode (level- and
 * edge-triggered, EPOLLONESHOT, EPOLLEXCLUSIVE). mux.c only adds, for TCP,
 * the RDHUP/HUP/ERR events an eventfd cannot carry. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bpd.h"

#define EXPORT __attribute__((visibility("default")))

struct bpd_config bpd_cfg = {.rx_poll_us = INT32_MIN};
static int config_error; /* the rules did not parse: nothing is offloaded */

/* ---- the real libc functions ---- */

static int (*real_socket)(int, int, int);
static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_listen)(int, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_shutdown)(int, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static int (*real_sendmmsg)(int, struct mmsghdr *, unsigned int, int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static int (*real_recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static int (*real_getsockname)(int, struct sockaddr *, socklen_t *);
static int (*real_getpeername)(int, struct sockaddr *, socklen_t *);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static int (*real_getsockopt)(int, int, int, void *, socklen_t *);
static int (*real_fcntl)(int, int, ...);
static int (*real_ioctl)(int, unsigned long, ...);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static ssize_t (*real_read_chk)(int, void *, size_t, size_t);
static ssize_t (*real_recv_chk)(int, void *, size_t, size_t, int);
static ssize_t (*real_recvfrom_chk)(int, void *, size_t, size_t, int, struct sockaddr *,
				    socklen_t *);

static void *sym(const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);
	if (!p) {
		fprintf(stderr, "libbypassd: libc has no %s: %s\n", name, dlerror());
		abort();
	}
	return p;
}

static void resolve(void)
{
#define R(name) real_##name = sym(#name)
	R(socket);
	R(bind);
	R(connect);
	R(listen);
	R(accept);
	R(accept4);
	R(close);
	R(shutdown);
	R(send);
	R(sendto);
	R(sendmsg);
	R(sendmmsg);
	R(write);
	R(writev);
	R(recv);
	R(recvfrom);
	R(recvmsg);
	R(recvmmsg);
	R(read);
	R(readv);
	R(getsockname);
	R(getpeername);
	R(setsockopt);
	R(getsockopt);
	R(fcntl);
	R(ioctl);
	R(dup);
	R(dup2);
	R(dup3);
#undef R
	real_read_chk = sym("__read_chk");
	real_recv_chk = sym("__recv_chk");
	real_recvfrom_chk = sym("__recvfrom_chk");
}

/* ---- the fd table ----
 * tab[fd] is the socket an fd names, or NULL. Readers load it without a
 * lock (NULL is the fast path); taking a reference locks one of STRIPES
 * mutexes, which every change of that slot holds too, so a socket cannot
 * be freed between the load and the reference. */

enum { STRIPES = 64 };
static _Atomic(struct bpd_sock *) *tab;
static int tabsize;
static pthread_mutex_t stripe[STRIPES];

static pthread_mutex_t *lock_of(int fd) { return &stripe[fd % STRIPES]; }

static int tracked(int fd)
{
	return fd >= 0 && fd < tabsize && atomic_load_explicit(&tab[fd], memory_order_relaxed);
}

struct bpd_sock *bpd_fd_get(int fd)
{
	if (!tracked(fd))
		return NULL;
	pthread_mutex_lock(lock_of(fd));
	struct bpd_sock *s = atomic_load(&tab[fd]);
	if (s)
		bpd_sock_ref(s);
	pthread_mutex_unlock(lock_of(fd));
	return s;
}

/* fd_set installs s (already referenced for the slot) at fd and returns
 * what was there (its slot reference now the caller's). */
static struct bpd_sock *slot_set(int fd, struct bpd_sock *s)
{
	if (fd < 0 || fd >= tabsize)
		return s; /* beyond the table: not tracked, hand the reference back */
	pthread_mutex_lock(lock_of(fd));
	struct bpd_sock *old = atomic_exchange(&tab[fd], s);
	pthread_mutex_unlock(lock_of(fd));
	return old;
}

void bpd_fd_foreach(void (*fn)(struct bpd_sock *, void *), void *arg)
{
	for (int fd = 0; fd < tabsize; fd++) {
		struct bpd_sock *s = bpd_fd_get(fd);
		if (s) {
			fn(s, arg);
			bpd_sock_unref(s);
		}
	}
}

/* drop_alias releases one fd's reference; the last alias closes the
 * socket for threads still blocked in it. */
static void drop_alias(struct bpd_sock *s)
{
	if (!s)
		return;
	if (atomic_fetch_sub(&s->aliases, 1) == 1) {
		atomic_store(&s->closed, 1);
		bpd_sock_wake(s);
	}
	bpd_sock_unref(s);
}

static void add_alias(int fd, struct bpd_sock *s)
{
	bpd_sock_ref(s);
	atomic_fetch_add(&s->aliases, 1);
	struct bpd_sock *old = slot_set(fd, s);
	if (old == s && (fd < 0 || fd >= tabsize)) {
		atomic_fetch_sub(&s->aliases, 1);
		bpd_sock_unref(s);
		return;
	}
	drop_alias(old);
}

/* ---- configuration and process events ---- */

static void atfork_prepare(void) { bpd_session_atfork_prepare(); }
static void atfork_parent(void) { bpd_session_atfork_parent(); }

static void fork_child_one(struct bpd_sock *s, void *arg)
{
	(void)arg;
	if (s->state != BPD_OFFLOADED || atomic_exchange(&s->forked, 1))
		return;
	/* The queues are the parent's (single producer, single consumer): the
	 * child must never touch them. Its descriptor stays, so that the
	 * program's own close() works, but every call fails with EBADFD. */
	if (s->mem)
		munmap(s->mem, s->memsize); /* version 1; version 2's session memory stays, unused */
	s->mem = NULL;
	/* Its descriptors too: a wake-up written here would reach the
	 * parent's eventfd. */
	bpd_sys_close(s->rxfd);
	bpd_sys_close(s->txfd);
	bpd_sys_close(s->doorbell);
	s->rxfd = s->txfd = s->doorbell = -1;
}

static void atfork_child(void)
{
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&stripe[i], NULL);
	bpd_session_forget_after_fork();
	bpd_fd_foreach(fork_child_one, NULL);
}

static void read_config(void)
{
	const char *v = getenv("BYPASSD_SOCKET");
	if (v && *v)
		snprintf(bpd_cfg.socket_path, sizeof(bpd_cfg.socket_path), "%s", v);
	v = getenv("BYPASSD_REQUIRE");
	bpd_cfg.require = v && !strcmp(v, "1");
	v = getenv("BYPASSD_RX_POLL");
	if (v && *v) {
		char *end;
		long us = strtol(v, &end, 10);
		if (*end || us < -1 || us > INT32_MAX)
			BPD_LOG(BPD_LOG_WARN, "BYPASSD_RX_POLL=%s is not -1, 0 or a number of µs; using "
					      "the daemon's policy",
				v);
		else
			bpd_cfg.rx_poll_us = (int)us;
	}
	v = getenv("BYPASSD_QUEUE_BYTES");
	if (v && *v) {
		unsigned long q = strtoul(v, NULL, 10);
		if (q < BPD_MIN_QUEUE || q > BPD_MAX_QUEUE || (q & (q - 1)))
			BPD_LOG(BPD_LOG_WARN, "BYPASSD_QUEUE_BYTES=%s is not a power of two from 4096 to "
					      "16777216; using the daemon's default",
				v);
		else
			bpd_cfg.queue_bytes = (uint32_t)q;
	}
	extern char *program_invocation_short_name;
	snprintf(bpd_cfg.program, sizeof(bpd_cfg.program), "%s", program_invocation_short_name);

	char *text = NULL, err[256];
	const char *rules = getenv("BYPASSD_RULES");
	const char *file = getenv("BYPASSD_RULES_FILE");
	if (file && *file) {
		FILE *f = fopen(file, "re");
		if (!f) {
			BPD_LOG(BPD_LOG_ERROR, "cannot read BYPASSD_RULES_FILE=%s: %s; nothing is offloaded",
				file, strerror(errno));
			config_error = 1;
			return;
		}
		size_t cap = 0;
		(void)!getdelim(&text, &cap, 0, f);
		fclose(f);
		rules = text;
	}
	if (bpd_rules_parse(&bpd_cfg.rules, rules, err, sizeof(err))) {
		BPD_LOG(BPD_LOG_ERROR, "%s: %s; nothing is offloaded (fix it, see docs/preload.md)",
			file && *file ? file : "BYPASSD_RULES", err);
		config_error = 1;
	}
	free(text);
}

__attribute__((constructor)) static void init(void)
{
	resolve();
	bpd_log_init();
	struct rlimit rl;
	rlim_t n = 65536;
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_max != RLIM_INFINITY && rl.rlim_max > n)
		n = rl.rlim_max;
	if (n > (1 << 20))
		n = 1 << 20;
	/* calloc of this size is an mmap: pages are committed as fds are used. */
	tab = calloc((size_t)n, sizeof(*tab));
	tabsize = tab ? (int)n : 0;
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&stripe[i], NULL);
	read_config();
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void exit_one(struct bpd_sock *s, void *arg)
{
	(void)arg;
	bpd_sock_at_exit(s);
}

/* At exit, datagrams a program queued just before exiting still leave
 * (the daemon drops the queues of a process that went away), and
 * connections end with FIN, not the reset of a session that vanished. */
__attribute__((destructor)) static void fini(void)
{
	BPD_LOG(BPD_LOG_DEBUG, "exit: waiting for queued datagrams to leave");
	if (tab)
		bpd_fd_foreach(exit_one, NULL);
}

/* ---- deciding ---- */

static int is_loopback(const struct bpd_addr *a)
{
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const uint8_t v6lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
	return (!memcmp(a->addr, v4, 12) && a->addr[12] == 127) || !memcmp(a->addr, v6lo, 16);
}

/* forget hands a pending socket to the kernel for good. */
static void forget(int fd, struct bpd_sock *s)
{
	struct bpd_sock *old = NULL;
	pthread_mutex_lock(lock_of(fd));
	if (atomic_load(&tab[fd]) == s) {
		old = s;
		atomic_store(&tab[fd], NULL);
	}
	pthread_mutex_unlock(lock_of(fd));
	if (old)
		drop_alias(old);
}

enum { DECIDE_KERNEL = 0, DECIDE_OFFLOADED = 1, DECIDE_ERROR = -1 };

/* decide offloads pending socket s (fd) for local and/or remote, or leaves
 * it to the kernel. DECIDE_ERROR sets errno (BYPASSD_REQUIRE=1, or the
 * daemon refused the address as the kernel would have). Called with s->mu. */
static int decide(int fd, struct bpd_sock *s, const struct bpd_addr *local,
		  const struct bpd_addr *remote)
{
	char a[64];
	const struct bpd_addr *shown = local ? local : remote;
	if (config_error) {
		if (bpd_cfg.require) {
			errno = EINVAL;
			return DECIDE_ERROR;
		}
		return DECIDE_KERNEL;
	}
	if ((local && is_loopback(local)) || (remote && is_loopback(remote)) ||
	    bpd_rules_match(&bpd_cfg.rules, bpd_cfg.program, local, remote) != BPD_RULE_OFFLOAD) {
		BPD_LOG(BPD_LOG_DEBUG, "fd %d (%s): kernel socket by rule", fd,
			bpd_fmt_addr(shown, a, sizeof(a)));
		return DECIDE_KERNEL;
	}
	int stage, err = bpd_sock_offload(s, local, remote, &stage);
	if (!err) {
		/* The program's descriptor becomes the RX eventfd, keeping its
		 * close-on-exec flag; the kernel socket it named is closed. */
		int cloexec = real_fcntl(fd, F_GETFD) & FD_CLOEXEC;
		if (real_dup3(s->rxfd, fd, cloexec ? O_CLOEXEC : 0) < 0) {
			err = errno;
			bpd_sock_release(s);
			s->state = BPD_PENDING;
			BPD_LOG(BPD_LOG_ERROR, "fd %d: cannot replace the kernel socket: %s", fd,
				strerror(err));
		} else {
			BPD_LOG(BPD_LOG_INFO, "fd %d: offloaded as bypassd socket %u, bound to %s", fd,
				s->id, bpd_fmt_addr(&s->laddr, a, sizeof(a)));
			return DECIDE_OFFLOADED;
		}
	}
	if (stage == BPD_STAGE_ADDR && err != EADDRNOTAVAIL) {
		/* The address is the problem (in use, privileged port, ...): the
		 * kernel would have said the same. */
		errno = err;
		return DECIDE_ERROR;
	}
	if (bpd_cfg.require) {
		if (stage == BPD_STAGE_SESSION && err == ENOENT)
			err = ECONNREFUSED; /* no socket file: no daemon, as a refused connect */
		BPD_LOG(BPD_LOG_ERROR, "fd %d (%s): not offloaded (%s) and BYPASSD_REQUIRE=1: failing "
				       "the call",
			fd, bpd_fmt_addr(shown, a, sizeof(a)), strerror(err));
		errno = err;
		return DECIDE_ERROR;
	}
	if (err == EADDRNOTAVAIL)
		BPD_LOG(BPD_LOG_INFO, "fd %d (%s): bypassd does not serve this address; kernel socket", fd,
			bpd_fmt_addr(shown, a, sizeof(a)));
	else if (stage != BPD_STAGE_SESSION) /* reaching bypassd failed: logged once already */
		BPD_LOG(BPD_LOG_WARN, "fd %d (%s): not offloaded (%s); using a kernel socket", fd,
			bpd_fmt_addr(shown, a, sizeof(a)), strerror(err));
	return DECIDE_KERNEL;
}

/* ---- the interposed functions ---- */

#define ENSURE(name)                                                                           \
	do {                                                                                   \
		if (!real_##name)                                                              \
			resolve();                                                             \
	} while (0)

/* fail returns -1 with errno err (for the int- and ssize_t-returning calls). */
static int fail(int err)
{
	errno = err;
	return -1;
}

EXPORT int socket(int domain, int type, int protocol)
{
	ENSURE(socket);
	int fd = real_socket(domain, type, protocol);
	int kind = type & 0xf;
	if (fd < 0 || fd >= tabsize || (domain != AF_INET && domain != AF_INET6) ||
	    !((kind == SOCK_DGRAM && (protocol == 0 || protocol == IPPROTO_UDP)) ||
	      (kind == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP))))
		return fd;
	struct bpd_sock *s = bpd_sock_new(domain, kind, (type & SOCK_NONBLOCK) != 0);
	if (s)
		drop_alias(slot_set(fd, s)); /* a stale entry cannot exist: fd was just allocated */
	return fd;
}

/* A thread can block in recv on a socket before the first send decides
 * it (sockperf's receiver thread does). The kernel socket it would block
 * on is replaced when the socket is offloaded, so such a receive waits
 * here instead until the socket is decided, then takes the chosen path. */
static pthread_mutex_t decided_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t decided_cv = PTHREAD_COND_INITIALIZER;

static void announce_decided(void)
{
	pthread_mutex_lock(&decided_mu);
	pthread_cond_broadcast(&decided_cv);
	pthread_mutex_unlock(&decided_mu);
}

static void cancelled_await(void *arg)
{
	pthread_mutex_unlock(&decided_mu);
	bpd_sock_unref(arg);
}

/* await_decided waits while s is pending and the receive may block.
 * Returns 0, or an errno (EAGAIN at SO_RCVTIMEO). A cancellation point,
 * like the receive it stands in for. */
static int await_decided(int fd, struct bpd_sock *s, int flags)
{
	/* A stream socket reads nothing before connect or accept (the
	 * kernel socket answers that). */
	if ((flags & MSG_DONTWAIT) || atomic_load(&s->nonblock) || s->type == SOCK_STREAM)
		return 0;
	int64_t t = atomic_load(&s->rcvtimeo_us), deadline = t ? bpd_now_us() + t : 0;
	pthread_mutex_lock(&decided_mu);
	while (s->state == BPD_PENDING && atomic_load_explicit(&tab[fd], memory_order_relaxed) == s) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000 * 1000; /* re-check now and then: the fd may be closed */
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cleanup_push(cancelled_await, s);
		pthread_cond_timedwait(&decided_cv, &decided_mu, &ts);
		pthread_cleanup_pop(0);
		if (deadline && bpd_now_us() >= deadline) {
			pthread_mutex_unlock(&decided_mu);
			return EAGAIN;
		}
	}
	pthread_mutex_unlock(&decided_mu);
	return 0;
}

/* pending_decide runs decide() for a socket that is still pending; the
 * caller holds a reference. Returns the decision, DECIDE_OFFLOADED also when
 * another thread offloaded it meanwhile. */
static int pending_decide(int fd, struct bpd_sock *s, const struct bpd_addr *local,
			  const struct bpd_addr *remote)
{
	pthread_mutex_lock(&s->mu);
	int d = s->state == BPD_OFFLOADED ? DECIDE_OFFLOADED : decide(fd, s, local, remote);
	pthread_mutex_unlock(&s->mu);
	if (d == DECIDE_KERNEL)
		forget(fd, s);
	if (d != DECIDE_ERROR)
		announce_decided();
	return d;
}

EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	ENSURE(bind);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_bind(fd, addr, len);
	int r;
	struct bpd_addr a;
	if (s->state == BPD_OFFLOADED) {
		r = fail(EINVAL); /* bound already (offloading binds) */
	} else if (bpd_addr_from_sockaddr(addr, len, s->family, &a)) {
		forget(fd, s); /* an address bypassd cannot carry (v4 on a v6 socket, ...) */
		r = real_bind(fd, addr, len);
	} else {
		int d = pending_decide(fd, s, &a, NULL);
		r = d == DECIDE_KERNEL ? real_bind(fd, addr, len) : d == DECIDE_OFFLOADED ? 0 : -1;
	}
	bpd_sock_unref(s);
	return r;
}

/* stream_connect: a pending socket is decided by the remote address (the
 * offload sends CONNECT); then the handshake is waited for, or
 * EINPROGRESS. */
static int stream_connect(int fd, struct bpd_sock *s, const struct sockaddr *addr, socklen_t len)
{
	struct bpd_addr a;
	int e = bpd_addr_from_sockaddr(addr, len, s->family, &a);
	if (s->state == BPD_OFFLOADED)
		return (e = e ? e : bpd_stream_connect(s, &a)) ? fail(e) : 0;
	if (e || bpd_addr_is_zero(&a)) {
		forget(fd, s); /* not an address bypassd carries */
		return real_connect(fd, addr, len);
	}
	int d = pending_decide(fd, s, NULL, &a);
	if (d == DECIDE_KERNEL)
		return real_connect(fd, addr, len);
	if (d == DECIDE_ERROR)
		return -1;
	e = atomic_load(&s->connecting) || s->connected ? bpd_stream_connected(s) : bpd_stream_connect(s, &a);
	return e ? fail(e) : 0;
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	ENSURE(connect);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_connect(fd, addr, len);
	int r, e;
	struct bpd_addr a;
	if (s->type == SOCK_STREAM) {
		r = stream_connect(fd, s, addr, len);
	} else if (addr && len >= (socklen_t)sizeof(sa_family_t) && addr->sa_family == AF_UNSPEC) {
		memset(&a, 0, sizeof(a)); /* disconnect */
		r = s->state == BPD_OFFLOADED ? ((e = bpd_sock_connect(s, &a)) ? fail(e) : 0)
					      : real_connect(fd, addr, len);
	} else if ((e = bpd_addr_from_sockaddr(addr, len, s->family, &a))) {
		if (s->state == BPD_OFFLOADED)
			r = fail(e);
		else {
			forget(fd, s);
			r = real_connect(fd, addr, len);
		}
	} else if (s->state == BPD_OFFLOADED) {
		r = (e = bpd_sock_connect(s, &a)) ? fail(e) : 0;
	} else {
		int d = pending_decide(fd, s, NULL, &a);
		if (d == DECIDE_KERNEL)
			r = real_connect(fd, addr, len);
		else if (d == DECIDE_ERROR)
			r = -1;
		else if (!s->connected) /* offloaded by another thread meanwhile */
			r = (e = bpd_sock_connect(s, &a)) ? fail(e) : 0;
		else
			r = 0;
	}
	bpd_sock_unref(s);
	return r;
}

EXPORT int close(int fd)
{
	ENSURE(close);
	bpd_mux_closed(fd); /* one load unless epoll holds stream sockets (mux.c) */
	if (!tracked(fd))
		return real_close(fd);
	struct bpd_sock *s = slot_set(fd, NULL);
	int r = real_close(fd);
	drop_alias(s);
	return r;
}

EXPORT int listen(int fd, int backlog)
{
	ENSURE(listen);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_listen(fd, backlog);
	int r, e;
	if (s->type != SOCK_STREAM) {
		r = s->state == BPD_OFFLOADED ? fail(EOPNOTSUPP) : real_listen(fd, backlog);
	} else if (s->state == BPD_OFFLOADED) {
		r = (e = bpd_stream_listen(s, backlog)) ? fail(e) : 0;
		char a[64];
		if (!r)
			BPD_LOG(BPD_LOG_INFO, "fd %d: listening on %s (bypassd socket %u)", fd,
				bpd_fmt_addr(&s->laddr, a, sizeof(a)), s->id);
	} else {
		/* Listening unbound: decided as a bind to the wildcard address
		 * and a port the daemon picks, as Linux binds one. */
		struct bpd_addr any = {{0}, 0};
		if (s->family == AF_INET)
			any.addr[10] = any.addr[11] = 0xff;
		int d = pending_decide(fd, s, &any, NULL);
		r = d == DECIDE_KERNEL	  ? real_listen(fd, backlog)
		    : d == DECIDE_ERROR	  ? -1
		    : (e = bpd_stream_listen(s, backlog)) ? fail(e)
							  : 0;
	}
	bpd_sock_unref(s);
	return r;
}

static int name_of(struct bpd_sock *s, const struct bpd_addr *a, int valid, struct sockaddr *sa,
		   socklen_t *len);

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *alen, int flags)
{
	ENSURE(accept4);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_accept4(fd, addr, alen, flags);
	if (s->state != BPD_OFFLOADED || s->type != SOCK_STREAM) {
		bpd_sock_unref(s);
		return real_accept4(fd, addr, alen, flags);
	}
	struct bpd_sock *n = NULL;
	int e = flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC) ? EINVAL
						       : bpd_stream_accept(s, atomic_load(&s->nonblock), &n);
	bpd_sock_unref(s);
	if (e)
		return fail(e);
	/* The program's descriptor for the connection is its RX eventfd, as
	 * for every offloaded socket. */
	int nfd = real_fcntl(n->rxfd, flags & SOCK_CLOEXEC ? F_DUPFD_CLOEXEC : F_DUPFD, 0);
	if (nfd < 0 || nfd >= tabsize) {
		e = nfd < 0 ? errno : EMFILE;
		if (nfd >= 0)
			real_close(nfd);
		bpd_sock_unref(n); /* closes it at the daemon */
		return fail(e);
	}
	atomic_store(&n->nonblock, (flags & SOCK_NONBLOCK) != 0);
	drop_alias(slot_set(nfd, n));
	if (addr && alen)
		(void)name_of(n, &n->raddr, 1, addr, alen);
	char a[64];
	BPD_LOG(BPD_LOG_INFO, "fd %d: accepted bypassd socket %u from %s", nfd, n->id,
		bpd_fmt_addr(&n->raddr, a, sizeof(a)));
	return nfd;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *alen)
{
	ENSURE(accept);
	if (!tracked(fd))
		return real_accept(fd, addr, alen);
	return accept4(fd, addr, alen, 0);
}

EXPORT int shutdown(int fd, int how)
{
	ENSURE(shutdown);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_shutdown(fd, how);
	int r = s->state != BPD_OFFLOADED ? real_shutdown(fd, how)
		: (r = s->type == SOCK_STREAM ? bpd_stream_shutdown(s, how) : bpd_sock_shutdown(s, how))
		    ? fail(r)
		    : 0;
	bpd_sock_unref(s);
	return r;
}

/* offloaded_for_send returns s offloaded, deciding a pending socket by the
 * destination of its first send; NULL (s released) when the send goes to
 * the kernel, *err set when it must fail. */
static struct bpd_sock *offloaded_for_send(int fd, struct bpd_sock *s, const struct msghdr *m,
					   int *err)
{
	*err = 0;
	if (s->state == BPD_OFFLOADED)
		return s;
	if (s->type == SOCK_STREAM) {
		bpd_sock_unref(s); /* not connected: the kernel socket answers */
		return NULL;
	}
	struct bpd_addr a;
	if (!m->msg_name || bpd_addr_from_sockaddr(m->msg_name, m->msg_namelen, s->family, &a) ||
	    bpd_addr_is_zero(&a)) {
		bpd_sock_unref(s); /* unconnected send without an address: the kernel answers */
		return NULL;
	}
	int d = pending_decide(fd, s, NULL, &a);
	if (d == DECIDE_OFFLOADED)
		return s;
	if (d == DECIDE_ERROR)
		*err = errno;
	bpd_sock_unref(s);
	return NULL;
}

static ssize_t send_common(int fd, struct bpd_sock *s, const struct msghdr *m, int flags,
			   ssize_t (*kernel)(int, const struct msghdr *, int))
{
	int err;
	if (!(s = offloaded_for_send(fd, s, m, &err)))
		return err ? fail(err) : kernel(fd, m, flags);
	ssize_t r = s->type == SOCK_STREAM ? bpd_stream_send(s, m, flags) : bpd_sock_send(s, m, flags);
	bpd_sock_unref(s);
	return r;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	ENSURE(sendmsg);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_sendmsg(fd, m, flags);
	return send_common(fd, s, m, flags, real_sendmsg);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
		      socklen_t tolen)
{
	ENSURE(sendto);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_sendto(fd, buf, len, flags, to, tolen);
	struct iovec iov = {(void *)buf, len};
	struct msghdr m = {.msg_name = (void *)to, .msg_namelen = tolen, .msg_iov = &iov,
			   .msg_iovlen = 1};
	return send_common(fd, s, &m, flags, real_sendmsg);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	ENSURE(send);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_send(fd, buf, len, flags);
	struct iovec iov = {(void *)buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	return send_common(fd, s, &m, flags, real_sendmsg);
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
	ENSURE(sendmmsg);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_sendmmsg(fd, v, n, flags);
	int err;
	if (n == 0 || !(s = offloaded_for_send(fd, s, &v[0].msg_hdr, &err))) {
		if (n == 0 && s)
			bpd_sock_unref(s);
		return n && err ? fail(err) : real_sendmmsg(fd, v, n, flags);
	}
	int r;
	if (s->type == SOCK_STREAM) {
		unsigned i = 0;
		for (ssize_t k; i < n && (k = bpd_stream_send(s, &v[i].msg_hdr, flags)) >= 0; i++)
			v[i].msg_len = (unsigned)k;
		r = i ? (int)i : -1;
	} else {
		r = bpd_sock_sendmmsg(s, v, n, flags);
	}
	bpd_sock_unref(s);
	return r;
}

static ssize_t write_common(struct bpd_sock *s, const struct iovec *iov, int cnt)
{
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt};
	if (s->state != BPD_OFFLOADED)
		return -2;
	ssize_t r = s->type == SOCK_STREAM ? bpd_stream_send(s, &m, 0) : bpd_sock_send(s, &m, 0);
	return r;
}

EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	ENSURE(write);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_write(fd, buf, len);
	struct iovec iov = {(void *)buf, len};
	ssize_t r = write_common(s, &iov, 1);
	bpd_sock_unref(s);
	return r == -2 ? real_write(fd, buf, len) : r;
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	ENSURE(writev);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_writev(fd, iov, cnt);
	ssize_t r = write_common(s, iov, cnt);
	bpd_sock_unref(s);
	return r == -2 ? real_writev(fd, iov, cnt) : r;
}

/* recv_common receives on an offloaded socket; -2: the kernel's. */
static ssize_t recv_common(int fd, struct bpd_sock *s, struct msghdr *m, int flags)
{
	if (s->state == BPD_PENDING) {
		int err = await_decided(fd, s, flags);
		if (err)
			return fail(err);
	}
	if (s->state != BPD_OFFLOADED)
		return -2;
	return s->type == SOCK_STREAM ? bpd_stream_recv(s, m, flags) : bpd_sock_recv(s, m, flags);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	ENSURE(recvmsg);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_recvmsg(fd, m, flags);
	ssize_t r = recv_common(fd, s, m, flags);
	bpd_sock_unref(s);
	return r == -2 ? real_recvmsg(fd, m, flags) : r;
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
			socklen_t *fromlen)
{
	ENSURE(recvfrom);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_recvfrom(fd, buf, len, flags, from, fromlen);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_name = from, .msg_namelen = from && fromlen ? *fromlen : 0,
			   .msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = recv_common(fd, s, &m, flags);
	bpd_sock_unref(s);
	if (r == -2)
		return real_recvfrom(fd, buf, len, flags, from, fromlen);
	if (r >= 0 && from && fromlen)
		*fromlen = m.msg_namelen;
	return r;
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	ENSURE(recv);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_recv(fd, buf, len, flags);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = recv_common(fd, s, &m, flags);
	bpd_sock_unref(s);
	return r == -2 ? real_recv(fd, buf, len, flags) : r;
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *timeout)
{
	ENSURE(recvmmsg);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_recvmmsg(fd, v, n, flags, timeout);
	int r = -2;
	if (s->state == BPD_PENDING && (r = await_decided(fd, s, flags)))
		r = fail(r);
	else if (s->state == BPD_OFFLOADED && s->type == SOCK_STREAM) {
		ssize_t k = n ? bpd_stream_recv(s, &v[0].msg_hdr, flags & ~MSG_WAITFORONE) : 0;
		if (k >= 0 && n)
			v[0].msg_len = (unsigned)k;
		r = k < 0 ? -1 : n ? 1 : 0; /* one message: a stream has no boundaries */
	} else if (s->state == BPD_OFFLOADED)
		r = bpd_sock_recvmmsg(s, v, n, flags, timeout);
	else
		r = -2;
	bpd_sock_unref(s);
	return r == -2 ? real_recvmmsg(fd, v, n, flags, timeout) : r;
}

EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	ENSURE(read);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_read(fd, buf, len);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = recv_common(fd, s, &m, 0);
	bpd_sock_unref(s);
	return r == -2 ? real_read(fd, buf, len) : r;
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	ENSURE(readv);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_readv(fd, iov, cnt);
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt};
	ssize_t r = recv_common(fd, s, &m, 0);
	bpd_sock_unref(s);
	return r == -2 ? real_readv(fd, iov, cnt) : r;
}

/* The _FORTIFY_SOURCE variants glibc's headers call instead. */
EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	ENSURE(read_chk);
	if (!tracked(fd) || len > buflen)
		return real_read_chk(fd, buf, len, buflen);
	return read(fd, buf, len);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	ENSURE(recv_chk);
	if (!tracked(fd) || len > buflen)
		return real_recv_chk(fd, buf, len, buflen, flags);
	return recv(fd, buf, len, flags);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
			      struct sockaddr *from, socklen_t *fromlen)
{
	ENSURE(recvfrom_chk);
	if (!tracked(fd) || len > buflen)
		return real_recvfrom_chk(fd, buf, len, buflen, flags, from, fromlen);
	return recvfrom(fd, buf, len, flags, from, fromlen);
}

static int name_of(struct bpd_sock *s, const struct bpd_addr *a, int valid, struct sockaddr *sa,
		   socklen_t *len)
{
	if (!valid)
		return fail(ENOTCONN);
	if (!len || !sa)
		return fail(EFAULT);
	struct sockaddr_storage ss;
	socklen_t l = bpd_addr_to_sockaddr(a, s->family, &ss);
	memcpy(sa, &ss, *len < l ? *len : l);
	*len = l;
	return 0;
}

EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	ENSURE(getsockname);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_getsockname(fd, sa, len);
	if (s->state == BPD_OFFLOADED && s->type == SOCK_STREAM)
		bpd_stream_settle(s); /* the handshake's end names the local address */
	int r = s->state == BPD_OFFLOADED ? name_of(s, &s->laddr, 1, sa, len)
					  : real_getsockname(fd, sa, len);
	bpd_sock_unref(s);
	return r;
}

EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *len)
{
	ENSURE(getpeername);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_getpeername(fd, sa, len);
	if (s->state == BPD_OFFLOADED && s->type == SOCK_STREAM)
		bpd_stream_settle(s);
	int r = s->state == BPD_OFFLOADED ? name_of(s, &s->raddr, s->connected, sa, len)
					  : real_getpeername(fd, sa, len);
	bpd_sock_unref(s);
	return r;
}

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	ENSURE(setsockopt);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_setsockopt(fd, level, name, val, len);
	int r;
	pthread_mutex_lock(&s->mu);
	if (s->state != BPD_OFFLOADED) {
		/* The kernel socket takes it (so a fallback keeps it); bypassd
		 * gets it too if the socket is offloaded later. */
		r = real_setsockopt(fd, level, name, val, len);
		if (r == 0)
			(void)bpd_sock_setsockopt(s, level, name, val, len);
	} else {
		int e = bpd_sock_setsockopt(s, level, name, val, len);
		r = e ? fail(e) : 0;
	}
	pthread_mutex_unlock(&s->mu);
	bpd_sock_unref(s);
	return r;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	ENSURE(getsockopt);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_getsockopt(fd, level, name, val, len);
	int r;
	if (s->state != BPD_OFFLOADED)
		r = real_getsockopt(fd, level, name, val, len);
	else {
		int e = bpd_sock_getsockopt(s, level, name, val, len);
		r = e ? fail(e) : 0;
	}
	bpd_sock_unref(s);
	return r;
}

/* set_nonblock records O_NONBLOCK for an offloaded socket. Its eventfd
 * itself always stays non-blocking (the library reads it to clear
 * readiness, and the daemon shares the open file). */
static void set_nonblock(struct bpd_sock *s, int on) { atomic_store(&s->nonblock, on != 0); }

EXPORT int fcntl(int fd, int cmd, ...)
{
	ENSURE(fcntl);
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!tracked(fd))
		return real_fcntl(fd, cmd, arg);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_fcntl(fd, cmd, arg);
	int r, iarg = (int)(intptr_t)arg;
	switch (cmd) {
	case F_DUPFD:
	case F_DUPFD_CLOEXEC:
		r = real_fcntl(fd, cmd, iarg);
		if (r >= 0)
			add_alias(r, s);
		break;
	case F_SETFL:
		if (s->state == BPD_OFFLOADED) {
			set_nonblock(s, iarg & O_NONBLOCK);
			r = real_fcntl(fd, F_SETFL, iarg | O_NONBLOCK);
		} else {
			r = real_fcntl(fd, F_SETFL, iarg);
			if (r == 0)
				set_nonblock(s, iarg & O_NONBLOCK);
		}
		break;
	case F_GETFL:
		r = real_fcntl(fd, F_GETFL);
		if (r >= 0 && s->state == BPD_OFFLOADED)
			r = (r & ~O_NONBLOCK) | (atomic_load(&s->nonblock) ? O_NONBLOCK : 0);
		break;
	default:
		r = real_fcntl(fd, cmd, arg);
	}
	bpd_sock_unref(s);
	return r;
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	ENSURE(ioctl);
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!tracked(fd) || (req != FIONBIO && req != FIONREAD))
		return real_ioctl(fd, req, arg);
	struct bpd_sock *s = bpd_fd_get(fd);
	if (!s)
		return real_ioctl(fd, req, arg);
	int r;
	if (s->state != BPD_OFFLOADED) {
		r = real_ioctl(fd, req, arg);
		if (r == 0 && req == FIONBIO && arg)
			set_nonblock(s, *(int *)arg);
	} else if (!arg) {
		r = fail(EFAULT);
	} else if (req == FIONBIO) {
		set_nonblock(s, *(int *)arg);
		r = 0;
	} else {
		int e = s->type == SOCK_STREAM ? bpd_stream_fionread(s, arg) : bpd_sock_fionread(s, arg);
		r = e ? fail(e) : 0;
	}
	bpd_sock_unref(s);
	return r;
}

EXPORT int dup(int fd)
{
	ENSURE(dup);
	int r = real_dup(fd);
	if (r >= 0 && tracked(fd)) {
		struct bpd_sock *s = bpd_fd_get(fd);
		if (s) {
			add_alias(r, s);
			bpd_sock_unref(s);
		}
	}
	return r;
}

static int dup_onto(int old, int nfd, int r)
{
	if (r < 0 || old == nfd)
		return r;
	struct bpd_sock *s = bpd_fd_get(old);
	if (s) {
		add_alias(nfd, s);
		bpd_sock_unref(s);
	} else if (tracked(nfd)) {
		drop_alias(slot_set(nfd, NULL)); /* the socket nfd named was closed by the dup */
	}
	return r;
}

EXPORT int dup2(int old, int nfd)
{
	ENSURE(dup2);
	return dup_onto(old, nfd, real_dup2(old, nfd));
}

EXPORT int dup3(int old, int nfd, int flags)
{
	ENSURE(dup3);
	return dup_onto(old, nfd, real_dup3(old, nfd, flags));
}
