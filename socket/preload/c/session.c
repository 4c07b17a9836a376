/* The process's control connection to bypassd (docs/protocol.md): HELLO,
 * requests matched to replies by request id, and a monitor thread that is
 * the connection's only reader. The monitor turns SHUTDOWN and end of
 * stream into broken sockets (every call on them then fails with
 * ECONNRESET instead of hanging) and SOCKET_ERROR into one broken socket.
 *
 * A session that died stays allocated (sockets may still point at it) but
 * is never used again; the next socket dials a new one, so a restarted
 * daemon serves new sockets. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bpd.h"

enum { MAX_PENDING = 64, CALL_TIMEOUT_S = 5 };

struct pending {
	uint32_t id; /* 0: free */
	int done;
	int err;
	struct bpd_reply *r;
};

struct bpd_session {
	int fd;
	struct bpd_hello_reply hello;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t next_id;
	int dead; /* errno calls fail with once the session is over */
	struct pending pend[MAX_PENDING];
	pthread_t monitor;
	/* Version 2: the session memory (mapped for the process's life: a
	 * dead session's sockets may still point into it), the client eventfd
	 * the monitor sleeps on, the lanes' doorbells, and slot -> socket for
	 * dispatching events (under mu). */
	struct bps mem;
	int wake_fd;
	int doorbell[BPS_MAX_LANES];
	struct bpd_sock **slots;
};

static pthread_mutex_t cur_mu = PTHREAD_MUTEX_INITIALIZER;
static struct bpd_session *cur;
static int warned_connect; /* one log line per outage, not one per socket */

static long sys_sendmsg(int fd, const struct msghdr *m, int flags)
{
	return syscall(SYS_sendmsg, fd, m, flags);
}

static long sys_recvmsg(int fd, struct msghdr *m, int flags)
{
	return syscall(SYS_recvmsg, fd, m, flags);
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			bpd_sys_close(fds[i]);
}

/* recv_msg receives one control message with its descriptors (fds has
 * room for BPD_MAX_FDS). Returns the length, 0 at end of stream, or
 * -errno. */
static long recv_msg(int fd, uint8_t *buf, int *fds, int *nfds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE((BPD_MAX_FDS + 2) * sizeof(int))];
	} cm;
	struct iovec iov = {buf, BPD_MSG_MAX};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			   .msg_controllen = sizeof(cm.b)};
	long n;
	do
		n = sys_recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	*nfds = 0;
	if (n < 0)
		return -errno;
	int bad = (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k; i++) {
			int f;
			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*nfds < BPD_MAX_FDS)
				fds[(*nfds)++] = f;
			else {
				bpd_sys_close(f);
				bad = 1;
			}
		}
	}
	if (bad) {
		close_fds(fds, *nfds);
		*nfds = 0;
		return -EPROTO;
	}
	return n;
}

static void session_fail(struct bpd_session *s, int err, const char *why)
{
	pthread_mutex_lock(&s->mu);
	int was = s->dead;
	if (!was)
		s->dead = err;
	for (int i = 0; i < MAX_PENDING; i++)
		if (s->pend[i].id && !s->pend[i].done) {
			s->pend[i].done = 1;
			s->pend[i].err = err;
		}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (!was) {
		BPD_LOG(BPD_LOG_WARN, "bypassd session ended (%s): offloaded sockets now fail with %s; "
				      "new sockets reconnect when bypassd is back",
			why, strerror(err));
		bpd_socks_break_session(s, err);
	}
}

/* dispatch wakes the socket in slot (version 2 events): its readiness
 * eventfd if its receive queue holds data, its sender if one waits for
 * room. Under s->mu, which a socket's release takes to unregister before
 * it closes those descriptors. */
static void dispatch(uint32_t slot, void *arg)
{
	struct bpd_session *s = arg;
	struct bpd_sock *k = slot < s->hello.max_sockets ? s->slots[slot] : NULL;
	if (!k)
		return; /* a socket closed meanwhile */
	if (atomic_load_explicit(k->rx.prod, memory_order_acquire) !=
	    atomic_load_explicit(k->rx.cons, memory_order_acquire))
		bpd_eventfd_wake(k->rxfd);
	if (atomic_load(&k->tx_waiting))
		bpd_eventfd_wake(k->txfd);
}

/* events drains the events bitmap until the monitor may sleep: it arms
 * client_sleeping and finds nothing pending (docs/shm-queue.md, "Who wakes
 * whom"). */
static void events(struct bpd_session *s)
{
	for (;;) {
		pthread_mutex_lock(&s->mu);
		bps_drain(&s->mem.events, dispatch, s);
		pthread_mutex_unlock(&s->mu);
		if (!bps_arm_client_sleep(&s->mem))
			return;
		bps_disarm_client_sleep(&s->mem);
	}
}

/* handle processes one control message from the daemon. */
static void handle(struct bpd_session *s, const uint8_t *buf, long n, int *fds, int nfds)
{
	struct bpd_hdr h;
	if (n < 0 || bpd_dec_hdr(buf, (size_t)n, &h)) {
		close_fds(fds, nfds);
		BPD_LOG(BPD_LOG_WARN, "bypassd sent an invalid control message; ignored");
		return;
	}
	const uint8_t *body = buf + BPD_HDR_LEN;
	size_t blen = (size_t)n - BPD_HDR_LEN;
	if (h.code == BPD_SHUTDOWN) {
		close_fds(fds, nfds);
		session_fail(s, ECONNRESET, "bypassd is shutting down");
		return; /* the daemon closes the connection next */
	}
	if (h.code == BPD_SOCKET_ERROR) {
		uint32_t e;
		close_fds(fds, nfds);
		if (!bpd_dec_u32(body, blen, &e) && e >= 1 && e <= 4095)
			bpd_socks_socket_error(s, h.socket, (int)e);
		return;
	}
	if (!(h.code & BPD_REPLY_BIT) || nfds > BPD_OPEN_FDS) {
		close_fds(fds, nfds);
		return;
	}
	pthread_mutex_lock(&s->mu);
	struct pending *p = NULL;
	for (int i = 0; i < MAX_PENDING; i++)
		if (s->pend[i].id == h.req_id && !s->pend[i].done)
			p = &s->pend[i];
	if (p) {
		p->r->h = h;
		memcpy(p->r->body, body, blen);
		p->r->body_len = blen;
		memcpy(p->r->fds, fds, sizeof(int) * (size_t)nfds);
		p->r->nfds = nfds;
		p->done = 1;
		pthread_cond_broadcast(&s->cv);
		nfds = 0;
	}
	pthread_mutex_unlock(&s->mu);
	close_fds(fds, nfds); /* an answer nobody waits for any more */
	if (!p && (h.code & ~BPD_REPLY_BIT) == BPD_OPEN && h.status == 0 && h.socket) {
		/* The OPEN timed out on our side: give the socket back. */
		uint8_t m[BPD_MSG_MAX];
		size_t l = bpd_enc_close(m, 0, h.socket);
		(void)!syscall(SYS_sendto, s->fd, m, l, MSG_NOSIGNAL | MSG_DONTWAIT, NULL, 0);
	}
}

static void *monitor(void *arg)
{
	struct bpd_session *s = arg;
	uint8_t buf[BPD_MSG_MAX];
	for (;;) {
		struct pollfd p[2] = {{s->fd, POLLIN, 0}, {s->wake_fd, POLLIN, 0}};
		if (s->wake_fd >= 0)
			events(s);
		if (poll(p, s->wake_fd >= 0 ? 2 : 1, -1) < 0)
			continue; /* EINTR: no signal is unblocked here, but be safe */
		if (s->wake_fd >= 0)
			bps_disarm_client_sleep(&s->mem);
		if (p[1].revents)
			bpd_eventfd_drain(s->wake_fd);
		if (!p[0].revents)
			continue;
		int fds[BPD_MAX_FDS], nfds;
		long n = recv_msg(s->fd, buf, fds, &nfds);
		if (n == 0 || (n < 0 && n != -EPROTO)) {
			session_fail(s, ECONNRESET, n == 0 ? "bypassd closed the connection" : strerror((int)-n));
			return NULL;
		}
		handle(s, buf, n, fds, nfds);
	}
}

static int send_msg(int fd, const uint8_t *msg, size_t len)
{
	struct iovec iov = {(void *)msg, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	long n;
	do
		n = sys_sendmsg(fd, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? errno : 0;
}

int bpd_call(struct bpd_session *s, uint8_t *msg, size_t len, struct bpd_reply *r)
{
	if (pthread_equal(pthread_self(), s->monitor)) {
		/* Only the monitor reads replies: a request it makes (a CLOSE when
		 * it dropped the last reference of a dead socket) is sent
		 * without waiting; the reply is discarded as unmatched. */
		memset(r, 0, sizeof(*r));
		return send_msg(s->fd, msg, len) ? ECONNRESET : ECANCELED;
	}
	pthread_mutex_lock(&s->mu);
	if (s->dead) {
		int e = s->dead;
		pthread_mutex_unlock(&s->mu);
		return e;
	}
	struct pending *p = NULL;
	while (!p) {
		for (int i = 0; i < MAX_PENDING && !p; i++)
			if (!s->pend[i].id)
				p = &s->pend[i];
		if (!p)
			pthread_cond_wait(&s->cv, &s->mu);
	}
	if (++s->next_id == 0)
		s->next_id = 1;
	uint32_t id = s->next_id;
	*p = (struct pending){.id = id, .r = r};
	pthread_mutex_unlock(&s->mu);

	memcpy(msg + 4, &id, 4);
	int err = send_msg(s->fd, msg, len);

	pthread_mutex_lock(&s->mu);
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += CALL_TIMEOUT_S;
	while (!err && !p->done)
		if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && !p->done) {
			err = ETIMEDOUT;
			BPD_LOG(BPD_LOG_WARN, "bypassd did not answer a request within %d s; it may be hung: "
					      "check its logs",
				CALL_TIMEOUT_S);
		}
	if (!err)
		err = p->err;
	p->id = 0;
	pthread_cond_broadcast(&s->cv); /* a slot is free */
	pthread_mutex_unlock(&s->mu);
	return err;
}

static const char *socket_path(void)
{
	return bpd_cfg.socket_path[0] ? bpd_cfg.socket_path : "/run/bypassd/bypassd.sock";
}

/* dial connects and runs HELLO; NULL with errno. */
/* connect_ctl connects to the control socket; -1 with errno (logged once
 * per outage). */
static int connect_ctl(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sun.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sun.sun_path, path);
	int fd = (int)syscall(SYS_socket, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (syscall(SYS_connect, fd, &sun, sizeof(sun)) < 0) {
		int e = errno;
		bpd_sys_close(fd);
		if (!warned_connect++)
			BPD_LOG(BPD_LOG_WARN,
				"cannot reach bypassd at %s: %s; %s", path, strerror(e),
				e == EACCES ? "ask for membership in the socket's group"
					    : "start it (bypassd --interface IFACE) or set BYPASSD_SOCKET");
		errno = e;
		return -1;
	}
	struct timeval tv = {CALL_TIMEOUT_S, 0};
	syscall(SYS_setsockopt, fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* hello runs HELLO offering version on fd. 0 with *hr and the reply's
 * descriptors, or an errno; *daemon_version is the version the daemon's
 * header carried (for a refusal: what it speaks). */
static int hello(int fd, int version, struct bpd_hello_reply *hr, int *fds, int *nfds,
		 int *daemon_version)
{
	uint8_t buf[BPD_MSG_MAX];
	size_t len = bpd_enc_hello(buf, 1, bpd_cfg.program, version);
	int err = send_msg(fd, buf, len);
	*nfds = 0;
	*daemon_version = 0;
	long n = err ? -err : recv_msg(fd, buf, fds, nfds);
	struct bpd_hdr h;
	atomic_store(&bpd_proto_version, version);
	err = n < 0 ? (int)-n : n == 0 ? ECONNRESET : bpd_dec_hdr(buf, (size_t)n, &h);
	if (n >= BPD_HDR_LEN)
		*daemon_version = buf[2] | buf[3] << 8;
	if (!err && (h.code != (BPD_HELLO | BPD_REPLY_BIT) || h.req_id != 1))
		err = EPROTO;
	if (!err)
		err = h.status;
	if (!err)
		err = bpd_dec_hello_reply(buf + BPD_HDR_LEN, (size_t)n - BPD_HDR_LEN, version, hr);
	if (!err && version == 2 &&
	    (hr->session_size == 0 || *nfds != 2 + hr->lanes || hr->max_sockets == 0))
		err = EPROTO; /* a socket-opening client gets session memory */
	if (!err && version == 1 && *nfds)
		err = EPROTO;
	if (err) {
		close_fds(fds, *nfds);
		*nfds = 0;
	}
	return err;
}

/* map_session maps and checks the version 2 session memory of a HELLO
 * reply and keeps its eventfds; it owns fds. */
static int map_session(struct bpd_session *s, int *fds, int nfds)
{
	const struct bpd_hello_reply *hr = &s->hello;
	int err = 0, want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	long seals = syscall(SYS_fcntl, fds[0], F_GET_SEALS);
	struct stat st;
	void *mem = MAP_FAILED;
	if (seals < 0 || (seals & want) != want || fstat(fds[0], &st) ||
	    (uint64_t)st.st_size != hr->session_size || hr->session_size > (1ull << 47))
		err = EPROTO;
	if (!err && (mem = mmap(NULL, hr->session_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0)) ==
			    MAP_FAILED)
		err = errno;
	if (!err && bps_attach(&s->mem, mem, hr->session_size, hr->max_sockets, hr->lanes))
		err = EPROTO;
	if (!err && !(s->slots = calloc(hr->max_sockets, sizeof(*s->slots))))
		err = ENOMEM;
	bpd_sys_close(fds[0]);
	if (err) {
		if (mem != MAP_FAILED)
			munmap(mem, hr->session_size);
		close_fds(fds + 1, nfds - 1);
		return err;
	}
	s->wake_fd = fds[1];
	for (int i = 0; i < hr->lanes; i++)
		s->doorbell[i] = fds[2 + i];
	return 0;
}

/* dial connects and runs HELLO, offering version 2 and, to a daemon that
 * answers that it speaks version 1, version 1 on a new connection. NULL
 * with errno. */
static struct bpd_session *dial(void)
{
	const char *path = socket_path();
	struct bpd_hello_reply hr;
	int fds[BPD_MAX_FDS], nfds = 0, fd = -1, err = EPROTONOSUPPORT, theirs = 0;
	for (int version = BPD_PROTO_MAX; version >= BPD_PROTO_MIN && err == EPROTONOSUPPORT; version--) {
		if ((fd = connect_ctl(path)) < 0)
			return NULL;
		err = hello(fd, version, &hr, fds, &nfds, &theirs);
		if (err == EPROTONOSUPPORT && theirs && theirs < version) {
			bpd_sys_close(fd);
			fd = -1;
			continue; /* an older daemon: offer what it speaks, if we do */
		}
		break;
	}
	if (err) {
		if (fd >= 0)
			bpd_sys_close(fd);
		if (err == EPROTONOSUPPORT)
			BPD_LOG(BPD_LOG_WARN, "bypassd at %s does not speak control protocol version %d..%d "
					      "(this libbypassd's)%s: run matching versions",
				path, BPD_PROTO_MIN, BPD_PROTO_MAX,
				theirs ? " and answered in another version" : "");
		else
			BPD_LOG(BPD_LOG_WARN, "HELLO with bypassd at %s failed: %s", path, strerror(err));
		errno = err;
		return NULL;
	}
	struct timeval tv = {0, 0};
	syscall(SYS_setsockopt, fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct bpd_session *s = calloc(1, sizeof(*s));
	if (!s) {
		close_fds(fds, nfds);
		bpd_sys_close(fd);
		errno = ENOMEM;
		return NULL;
	}
	s->fd = fd;
	s->hello = hr;
	s->next_id = 1;
	s->wake_fd = -1;
	if (hr.version == 2 && (err = map_session(s, fds, nfds))) {
		BPD_LOG(BPD_LOG_WARN, "bypassd at %s sent session memory this libbypassd cannot use (%s): "
				      "run matching versions",
			path, strerror(err));
		bpd_sys_close(fd);
		free(s);
		errno = err;
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	/* The monitor takes no signals: they belong to the program's threads. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64 << 10);
	err = pthread_create(&s->monitor, &attr, monitor, s);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err) {
		/* The session memory stays mapped (and leaked): rare enough. */
		bpd_sys_close(fd);
		errno = err;
		return NULL;
	}
	if (warned_connect)
		BPD_LOG(BPD_LOG_WARN, "connected to bypassd at %s again", path);
	warned_connect = 0;
	BPD_LOG(BPD_LOG_INFO, "connected to bypassd at %s (daemon pid %u, protocol version %d)", path,
		hr.daemon_pid, hr.version);
	return s;
}

struct bpd_session *bpd_session_get(void)
{
	pthread_mutex_lock(&cur_mu);
	if (cur && bpd_session_dead(cur))
		cur = NULL; /* left allocated: its sockets still refer to it */
	if (!cur)
		cur = dial();
	struct bpd_session *s = cur;
	int e = errno;
	pthread_mutex_unlock(&cur_mu);
	errno = e;
	return s;
}


int bpd_session_dead(struct bpd_session *s)
{
	pthread_mutex_lock(&s->mu);
	int d = s->dead;
	pthread_mutex_unlock(&s->mu);
	return d;
}

int bpd_session_version(struct bpd_session *s) { return s->hello.version; }

struct bps *bpd_session_mem(struct bpd_session *s) { return &s->mem; }

int bpd_session_doorbell(struct bpd_session *s, uint32_t lane)
{
	return lane < s->hello.lanes ? s->doorbell[lane] : -1;
}

void bpd_session_register(struct bpd_session *s, uint32_t slot, struct bpd_sock *sock)
{
	pthread_mutex_lock(&s->mu);
	if (slot < s->hello.max_sockets)
		s->slots[slot] = sock;
	pthread_mutex_unlock(&s->mu);
}

int bpd_session_poll_us(struct bpd_session *s)
{
	return bpd_cfg.rx_poll_us != INT32_MIN ? bpd_cfg.rx_poll_us : s->hello.rx_poll_us;
}

void bpd_session_atfork_prepare(void) { pthread_mutex_lock(&cur_mu); }

void bpd_session_atfork_parent(void) { pthread_mutex_unlock(&cur_mu); }

/* In the child: the parent's session is not ours. Closing our copy of the
 * connection matters: otherwise the daemon would not see the parent's end
 * while the child lives. The session struct is leaked on purpose (its
 * mutex may have been held by a parent thread at fork time). */
void bpd_session_forget_after_fork(void)
{
	pthread_mutex_init(&cur_mu, NULL);
	if (cur) {
		bpd_sys_close(cur->fd);
		if (cur->wake_fd >= 0)
			bpd_sys_close(cur->wake_fd);
		for (int i = 0; i < cur->hello.lanes; i++)
			bpd_sys_close(cur->doorbell[i]);
	}
	cur = NULL;
	warned_connect = 0;
}
