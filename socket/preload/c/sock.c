/* One offloaded socket: its queues (attached, announced and waited on here
 * for both protocol versions, and for stream.c's TCP sockets too), the
 * UDP data calls and the options.
 *
 * Readiness. The application's descriptor for an offloaded socket is the
 * socket's RX eventfd (intercept.c dup3()s it over the kernel socket the
 * program got from socket(2)), so poll, select and epoll work on it
 * unchanged, mixed with any other descriptors. For that to be level-correct
 * the eventfd must be readable exactly while the RX queue holds a datagram:
 *   - while the queue is empty, "consumer waiting" stays armed, so the
 *     daemon signals the empty -> non-empty edge by writing the eventfd;
 *   - the receiver that empties the queue drains the eventfd and re-arms,
 *     then re-checks the queue (the Dekker pair of docs/shm-queue.md); if
 *     data arrived meanwhile it writes the eventfd itself.
 * A flag still armed means the daemon has not written since the last drain,
 * so the drain (a read(2)) is skipped then. EPOLLOUT is always reported (an
 * eventfd is writable); a send to a full queue waits or fails with EAGAIN
 * like a kernel socket with a full buffer.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bpd.h"

#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

struct bpd_sock *bpd_sock_new(int family, int type, int nonblock)
{
	struct bpd_sock *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->refs = 1;
	s->aliases = 1;
	s->state = BPD_PENDING;
	s->family = family;
	s->type = type;
	s->nonblock = nonblock;
	s->rxfd = s->txfd = s->doorbell = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->txmu, NULL);
	pthread_mutex_init(&s->rxmu, NULL);
	return s;
}

void bpd_sock_ref(struct bpd_sock *s) { atomic_fetch_add(&s->refs, 1); }

void bpd_sock_unref(struct bpd_sock *s)
{
	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	bpd_sock_release(s);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->txmu);
	pthread_mutex_destroy(&s->rxmu);
	free(s);
}

/* ---- small helpers ---- */

ssize_t bpd_sys_read(int fd, void *b, size_t n) { return syscall(SYS_read, fd, b, n); }
ssize_t bpd_sys_write(int fd, const void *b, size_t n) { return syscall(SYS_write, fd, b, n); }
int bpd_sys_close(int fd) { return (int)syscall(SYS_close, fd); }

int bpd_eventfd_wake(int fd)
{
	uint64_t one = 1;
	return bpd_sys_write(fd, &one, 8) == 8 ? 0 : -1;
}

void bpd_eventfd_drain(int fd)
{
	uint64_t v;
	(void)!bpd_sys_read(fd, &v, 8); /* non-blocking: EAGAIN when already 0 */
}

int64_t bpd_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* libc's ppoll, not the raw system call: it is a cancellation point, as
 * the recvfrom it stands in for is (sockperf cancels its receiving thread
 * at the end of a test). Callers hold locks and a reference and push
 * cleanup handlers that release them. */
int bpd_wait_fd(int fd, int64_t timeout_us)
{
	struct pollfd p = {fd, POLLIN, 0};
	struct timespec ts, *tp = NULL;
	if (timeout_us >= 0) {
		ts.tv_sec = timeout_us / 1000000;
		ts.tv_nsec = (timeout_us % 1000000) * 1000;
		tp = &ts;
	}
	int r = ppoll(&p, 1, tp, NULL);
	return r < 0 ? -1 : r > 0;
}

/* Cancellation cleanup of a thread cancelled while blocked in a data call:
 * the call's lock and the reference intercept.c took for it. */
static void cancelled_rx(void *arg)
{
	struct bpd_sock *s = arg;
	pthread_mutex_unlock(&s->rxmu);
	bpd_sock_unref(s);
}

static void cancelled_tx(void *arg)
{
	struct bpd_sock *s = arg;
	pthread_mutex_unlock(&s->txmu);
	bpd_sock_unref(s);
}

/* wait_cancellable is bpd_wait_fd with cleanup pushed (its own function:
 * pthread_cleanup_push is a setjmp, which must not see the caller's
 * locals). */
static int wait_cancellable(int fd, int64_t timeout_us, void (*cleanup)(void *), struct bpd_sock *s)
{
	volatile int w = -1;
	pthread_cleanup_push(cleanup, s);
	w = bpd_wait_fd(fd, timeout_us);
	pthread_cleanup_pop(0);
	return w;
}

int bpd_sock_usable(struct bpd_sock *s)
{
	if (atomic_load(&s->forked))
		return EBADFD;
	if (atomic_load(&s->closed))
		return EBADF;
	return atomic_load(&s->broken);
}

void bpd_sock_wake(struct bpd_sock *s)
{
	if (s->rxfd >= 0)
		bpd_eventfd_wake(s->rxfd);
	if (s->txfd >= 0)
		bpd_eventfd_wake(s->txfd);
}

void bpd_sock_break(struct bpd_sock *s, int err)
{
	int zero = 0;
	if (atomic_compare_exchange_strong(&s->broken, &zero, err))
		bpd_sock_wake(s); /* readable from now on: every call fails at once */
}

/* ---- control requests about this socket ---- */

/* request runs one request; 0, the daemon's errno, or a transport errno. */
int bpd_sock_request(struct bpd_sock *s, uint8_t *msg, size_t len, struct bpd_reply *r)
{
	int err = bpd_call(s->sess, msg, len, r);
	if (err)
		return err;
	for (int i = 0; i < r->nfds; i++)
		bpd_sys_close(r->fds[i]);
	r->nfds = 0;
	if (r->h.code != ((msg[0] | msg[1] << 8) | BPD_REPLY_BIT))
		return EPROTO;
	return r->h.status;
}

static int daemon_setsockopt(struct bpd_sock *s, int level, int name, const void *val, uint32_t len)
{
	if (len > 64)
		return EINVAL;
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_setsockopt(m, 0, s->id, level, name, val, len);
	return bpd_sock_request(s, m, l, &r);
}

static int is_membership(int level, int name)
{
	if (level == IPPROTO_IP)
		return name == IP_ADD_MEMBERSHIP || name == IP_DROP_MEMBERSHIP ||
		       name == IP_ADD_SOURCE_MEMBERSHIP || name == IP_DROP_SOURCE_MEMBERSHIP ||
		       name == MCAST_JOIN_GROUP || name == MCAST_LEAVE_GROUP ||
		       name == MCAST_JOIN_SOURCE_GROUP || name == MCAST_LEAVE_SOURCE_GROUP;
	if (level == IPPROTO_IPV6)
		return name == IPV6_ADD_MEMBERSHIP || name == IPV6_DROP_MEMBERSHIP ||
		       name == MCAST_JOIN_GROUP || name == MCAST_LEAVE_GROUP ||
		       name == MCAST_JOIN_SOURCE_GROUP || name == MCAST_LEAVE_SOURCE_GROUP;
	return 0;
}

static uint32_t queue_bytes_for(const struct bpd_sock *s)
{
	if (bpd_cfg.queue_bytes)
		return bpd_cfg.queue_bytes;
	/* SO_RCVBUF/SO_SNDBUF set before the socket was offloaded size its
	 * queues, as they size a kernel socket's buffers. */
	uint32_t want = s->rcvbuf > s->sndbuf ? s->rcvbuf : s->sndbuf;
	if (!want)
		return 0;
	uint32_t q = BPD_MIN_QUEUE;
	while (q < want && q < BPD_MAX_QUEUE)
		q <<= 1;
	return q;
}

static void unmap(struct bpd_sock *s)
{
	if (s->sess && bpd_session_version(s->sess) == 2)
		bpd_session_register(s->sess, s->slot, NULL); /* before its fds close */
	if (s->mem)
		munmap(s->mem, s->memsize);
	s->mem = NULL;
	int *fds[] = {&s->rxfd, &s->txfd, &s->doorbell};
	for (int i = 0; i < 3; i++)
		if (*fds[i] >= 0) {
			bpd_sys_close(*fds[i]);
			*fds[i] = -1;
		}
}

/* attach_v1 checks and maps an OPEN reply's memfd (protocol version 1)
 * and keeps its eventfds. */
static int attach_v1(struct bpd_sock *s, struct bpd_reply *r)
{
	struct bpd_open_reply o;
	int err = r->nfds != BPD_OPEN_FDS ? EPROTO
					   : bpd_dec_open_reply(r->body, r->body_len, 1, &o);
	int memfd = r->nfds > 0 ? r->fds[BPD_FD_MEMFD] : -1;
	if (!err) {
		long seals = syscall(SYS_fcntl, memfd, F_GET_SEALS);
		struct stat st;
		int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
		if (seals < 0 || (seals & want) != want || fstat(memfd, &st) ||
		    (uint64_t)st.st_size != o.memfd_size || o.memfd_size > (1ull << 31))
			err = EPROTO;
	}
	if (!err) {
		s->mem = mmap(NULL, o.memfd_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
		if (s->mem == MAP_FAILED) {
			s->mem = NULL;
			err = errno;
		}
		s->memsize = o.memfd_size;
	}
	uint64_t qs = BPQ_HEADER + (uint64_t)(err ? 0 : o.queue_bytes);
	if (!err && (bpq_attach(&s->tx, (uint8_t *)s->mem + o.tx_offset, qs) ||
		     bpq_attach(&s->rx, (uint8_t *)s->mem + o.rx_offset, qs)))
		err = EPROTO;
	if (memfd >= 0)
		bpd_sys_close(memfd);
	if (err) {
		for (int i = 1; i < r->nfds; i++)
			bpd_sys_close(r->fds[i]);
		if (s->mem)
			munmap(s->mem, s->memsize);
		s->mem = NULL;
		return err;
	}
	s->rxfd = r->fds[BPD_FD_RXWAIT];
	s->txfd = r->fds[BPD_FD_TXWAIT];
	s->doorbell = r->fds[BPD_FD_DOORBELL];
	s->max_payload = s->tx.max_payload - (s->type == SOCK_STREAM ? 0 : BPD_DGRAM_HDR);
	return 0;
}

/* attach_v2 attaches the queues an OPEN reply places in the session memory
 * (protocol version 2) and makes the socket's own eventfds: rxfd, the
 * readiness the program's descriptor becomes, and txfd, which a sender
 * waiting for room sleeps on. The monitor writes them for the socket's
 * events (session.c). */
static int attach_v2(struct bpd_sock *s, struct bpd_reply *r)
{
	struct bpd_open_reply o;
	struct bps *m = bpd_session_mem(s->sess);
	int err = r->nfds ? EPROTO : bpd_dec_open_reply(r->body, r->body_len, 2, &o);
	if (!err && (o.slot >= m->slots || o.lane >= m->lanes || !bps_queue_ok(m, o.tx_offset, o.queue_bytes) ||
		     !bps_queue_ok(m, o.rx_offset, o.queue_bytes)))
		err = EPROTO;
	uint64_t qs = BPQ_HEADER + (uint64_t)(err ? 0 : o.queue_bytes);
	if (!err && (bpq_attach(&s->tx, m->mem + o.tx_offset, qs) || bpq_attach(&s->rx, m->mem + o.rx_offset, qs) ||
		     s->tx.cap != o.queue_bytes || s->rx.cap != o.queue_bytes))
		err = EPROTO;
	if (!err) {
		s->rxfd = (int)syscall(SYS_eventfd2, 0, EFD_NONBLOCK | EFD_CLOEXEC);
		s->txfd = (int)syscall(SYS_eventfd2, 0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (s->rxfd < 0 || s->txfd < 0)
			err = errno; /* the caller's unmap closes whichever was made */
	}
	for (int i = 0; i < r->nfds; i++)
		bpd_sys_close(r->fds[i]);
	if (err)
		return err;
	s->slot = o.slot;
	s->lane = o.lane;
	s->max_payload = s->tx.max_payload - (s->type == SOCK_STREAM ? 0 : BPD_DGRAM_HDR);
	bpd_session_register(s->sess, s->slot, s);
	return 0;
}

int bpd_sock_attach(struct bpd_sock *s, struct bpd_reply *r)
{
	return bpd_session_version(s->sess) == 2 ? attach_v2(s, r) : attach_v1(s, r);
}


/* replay sends the options saved while the socket was pending: memberships
 * (pass 1) or the others (pass 0). A refusal is logged, not fatal: the
 * kernel had accepted them. */
static void replay(struct bpd_sock *s, int pass)
{
	for (int i = 0; i < s->nsaved; i++) {
		struct bpd_saved_opt *o = &s->saved[i];
		if (is_membership(o->level, o->name) != pass)
			continue;
		int e = bpd_sock_setsockopt(s, o->level, o->name, o->val, (socklen_t)o->len);
		if (e)
			BPD_LOG(BPD_LOG_WARN, "socket %u: option %d/%d set before the socket was offloaded "
					      "was refused by bypassd: %s",
				s->id, o->level, o->name, strerror(e));
	}
}

int bpd_sock_offload(struct bpd_sock *s, const struct bpd_addr *local, const struct bpd_addr *remote,
		     int *stage)
{
	*stage = BPD_STAGE_SESSION;
	struct bpd_session *sess = bpd_session_get();
	if (!sess)
		return errno ? errno : ECONNREFUSED;
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_open(m, 0, (uint16_t)s->family, s->type, queue_bytes_for(s));
	int err = bpd_call(sess, m, l, &r);
	if (!err && (r.h.code != (BPD_OPEN | BPD_REPLY_BIT) || (r.h.status == 0 && !r.h.socket)))
		err = EPROTO;
	if (!err && r.h.status) {
		err = r.h.status;
		for (int i = 0; i < r.nfds; i++)
			bpd_sys_close(r.fds[i]);
	}
	*stage = BPD_STAGE_OPEN;
	if (err)
		return err;
	s->sess = sess;
	s->id = r.h.socket;
	if ((err = bpd_sock_attach(s, &r))) {
		if (s->rxfd >= 0)
			bpd_sys_close(s->rxfd);
		if (s->txfd >= 0)
			bpd_sys_close(s->txfd);
		s->rxfd = s->txfd = -1;
		l = bpd_enc_close(m, 0, s->id);
		(void)bpd_sock_request(s, m, l, &r);
		s->sess = NULL;
		return err;
	}
	/* Options set on the kernel socket before: those that shape the bind
	 * now, memberships once bound. */
	s->state = BPD_OFFLOADED;
	replay(s, 0);
	struct bpd_addr any = {{0}, 0};
	if (s->family == AF_INET)
		any.addr[10] = any.addr[11] = 0xff;
	const struct bpd_addr *la = local ? local : &any;
	/* A stream socket's BIND takes no flags (SO_REUSEADDR means nothing
	 * for a port the daemon reserves for one socket). */
	l = bpd_enc_addrport(m, BPD_BIND, 0, s->id, la,
			     s->reuseaddr && s->type != SOCK_STREAM ? BPD_BIND_REUSEADDR : 0);
	err = bpd_call(sess, m, l, &r);
	if (!err && r.h.status) {
		err = r.h.status;
		*stage = BPD_STAGE_ADDR;
	}
	if (!err && bpd_dec_addrport(r.body, r.body_len, &s->laddr))
		err = EPROTO;
	if (!err) {
		s->bound = 1;
		replay(s, 1);
	}
	if (!err && remote) {
		l = bpd_enc_addrport(m, BPD_CONNECT, 0, s->id, remote, 0);
		err = bpd_sock_request(s, m, l, &r);
		if (!err) {
			s->raddr = *remote;
			/* A stream socket's handshake has only started: its end
			 * comes as an event (stream.c). */
			if (s->type == SOCK_STREAM)
				atomic_store(&s->connecting, 1);
			else
				s->connected = 1;
		} else if (err != ETIMEDOUT && err != ECONNRESET) {
			*stage = BPD_STAGE_ADDR;
		}
	}
	if (err) {
		l = bpd_enc_close(m, 0, s->id);
		(void)bpd_sock_request(s, m, l, &r);
		unmap(s);
		s->sess = NULL;
		s->bound = 0;
		s->state = BPD_PENDING;
		return err;
	}
	pthread_mutex_lock(&s->rxmu);
	bpd_sock_rx_rearm(s);
	pthread_mutex_unlock(&s->rxmu);
	return 0;
}

int bpd_sock_connect(struct bpd_sock *s, const struct bpd_addr *remote)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_addrport(m, BPD_CONNECT, 0, s->id, remote, 0);
	pthread_mutex_lock(&s->mu);
	err = bpd_sock_request(s, m, l, &r);
	if (!err) {
		s->raddr = *remote;
		s->connected = !bpd_addr_is_zero(remote);
	}
	pthread_mutex_unlock(&s->mu);
	return err;
}

/* drain waits (up to timeout_us) until the daemon has taken everything
 * queued for sending. */
static void drain(struct bpd_sock *s, int64_t timeout_us)
{
	if (s->state != BPD_OFFLOADED || atomic_load(&s->forked) || atomic_load(&s->broken) || !s->tx.prod)
		return;
	int64_t end = bpd_now_us() + timeout_us;
	while (atomic_load_explicit(s->tx.cons, memory_order_acquire) !=
		       atomic_load_explicit(s->tx.prod, memory_order_acquire) &&
	       bpd_now_us() < end && !bpd_session_dead(s->sess)) {
		struct timespec ts = {0, 50000};
		nanosleep(&ts, NULL);
	}
}

/* bpd_sock_flush waits (up to 1 s) for a datagram socket's queue: a kernel
 * socket's send has handed the datagram on when it returns, and a program
 * that sends and exits (or closes) expects it to leave. The daemon drops a
 * closed datagram socket's queue (a stream's it still sends). */
void bpd_sock_flush(struct bpd_sock *s)
{
	if (s->type != SOCK_STREAM)
		drain(s, 1000000);
}

void bpd_sock_at_exit(struct bpd_sock *s)
{
	if (s->type != SOCK_STREAM) {
		bpd_sock_flush(s);
		return;
	}
	/* A process that exits closes its connections the orderly way (FIN
	 * after the queued bytes), as the kernel does; the daemon resets the
	 * connections of a session that ends without CLOSE. */
	if (s->state != BPD_OFFLOADED || atomic_load(&s->forked) || !s->sess || bpd_session_dead(s->sess))
		return;
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_close(m, 0, s->id);
	(void)bpd_sock_request(s, m, l, &r);
}

void bpd_sock_release(struct bpd_sock *s)
{
	if (s->state != BPD_OFFLOADED)
		return;
	if (s->type != SOCK_STREAM)
		bpd_sock_flush(s);
	else if (s->linger_on && s->linger_secs > 0)
		/* SO_LINGER with a timeout: close waits (that long at most) until
		 * the daemon took the queued bytes; without it the daemon still
		 * sends them after CLOSE, as the kernel does after close(2). */
		drain(s, (int64_t)s->linger_secs * 1000000);
	if (s->sess && bpd_session_version(s->sess) == 2)
		bpd_session_register(s->sess, s->slot, NULL); /* no event reaches it from here on */
	if (!atomic_load(&s->forked) && s->sess && !bpd_session_dead(s->sess)) {
		uint8_t m[BPD_MSG_MAX];
		struct bpd_reply r;
		size_t l = bpd_enc_close(m, 0, s->id);
		(void)bpd_sock_request(s, m, l, &r);
	}
	unmap(s);
	s->state = 0;
}

int bpd_sock_shutdown(struct bpd_sock *s, int how)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	if (how < SHUT_RD || how > SHUT_RDWR)
		return EINVAL;
	if (!s->connected)
		return ENOTCONN; /* as the kernel answers for an unconnected UDP socket */
	if (how != SHUT_WR)
		atomic_store(&s->shut_rd, 1);
	if (how != SHUT_RD)
		atomic_store(&s->shut_wr, 1);
	bpd_sock_wake(s);
	return 0;
}

/* ---- sending ---- */

/* kick publishes what was queued and wakes the engine if it asked: the
 * socket's doorbell (version 1), or an announce on its lane, which rings
 * the lane's doorbell only if the engine sleeps (version 2). */
void bpd_sock_kick(struct bpd_sock *s)
{
	if (!bpq_publish(&s->tx))
		return;
	if (bpd_session_version(s->sess) == 1)
		bpd_eventfd_wake(s->doorbell);
	else if (bps_announce(bpd_session_mem(s->sess), s->lane, s->slot))
		bpd_eventfd_wake(bpd_session_doorbell(s->sess, s->lane));
}

/* wait_room waits for room for an n-byte record in the TX queue. */
int bpd_sock_wait_room(struct bpd_sock *s, uint32_t n, int64_t deadline)
{
	for (;;) {
		int err = bpd_sock_usable(s);
		if (err)
			return err;
		if (bpq_arm_write_wait(&s->tx, n)) {
			bpq_disarm_write_wait(&s->tx);
			return 0;
		}
		int64_t left = -1;
		if (deadline) {
			left = deadline - bpd_now_us();
			if (left <= 0) {
				bpq_disarm_write_wait(&s->tx);
				return EAGAIN;
			}
		}
		atomic_store(&s->tx_waiting, 1);
		int w = wait_cancellable(s->txfd, left, cancelled_tx, s);
		atomic_store(&s->tx_waiting, 0);
		bpq_disarm_write_wait(&s->tx);
		if (w < 0 && errno == EINTR)
			return EINTR;
		if (w > 0)
			bpd_eventfd_drain(s->txfd);
	}
}

int64_t bpd_deadline_of(_Atomic int64_t *timeo)
{
	int64_t t = atomic_load(timeo);
	return t ? bpd_now_us() + t : 0;
}

/* destination resolves a send's address: the given one, or the peer. */
static int destination(struct bpd_sock *s, const struct msghdr *m, struct bpd_addr *dst, int *limit)
{
	if (m->msg_name && m->msg_namelen) {
		int err = bpd_addr_from_sockaddr(m->msg_name, m->msg_namelen, s->family, dst);
		if (err)
			return err;
		if (bpd_addr_is_zero(dst) || !dst->port)
			return dst->port ? EDESTADDRREQ : EINVAL;
	} else if (s->connected) {
		memset(dst, 0, sizeof(*dst)); /* the engine fills in the peer */
	} else {
		return EDESTADDRREQ;
	}
	*limit = s->family == AF_INET ? 65507 : 65527;
	if ((uint32_t)*limit > s->max_payload)
		*limit = (int)s->max_payload;
	return 0;
}

/* put queues one datagram (the TX lock held); 0 or an errno. */
static int put(struct bpd_sock *s, const struct msghdr *m, const struct bpd_addr *dst, size_t len,
	       int nonblock, int64_t deadline)
{
	uint8_t *rec;
	for (;;) {
		int q = bpq_reserve(&s->tx, (uint32_t)(BPD_DGRAM_HDR + len), &rec);
		if (q == BPQ_OK)
			break;
		if (q == BPQ_CORRUPT) {
			BPD_LOG(BPD_LOG_ERROR, "socket %u: send queue corrupt; the socket is unusable", s->id);
			bpd_sock_break(s, EIO);
			return EIO;
		}
		if (q == BPQ_TOOBIG)
			return EMSGSIZE;
		bpd_sock_kick(s); /* let the engine see what is queued, then wait */
		if (nonblock)
			return EAGAIN;
		int err = bpd_sock_wait_room(s, (uint32_t)(BPD_DGRAM_HDR + len), deadline);
		if (err)
			return err;
	}
	memset(rec, 0, BPD_DGRAM_HDR);
	memcpy(rec, dst->addr, 16);
	rec[16] = (uint8_t)dst->port;
	rec[17] = (uint8_t)(dst->port >> 8);
	uint8_t *p = rec + BPD_DGRAM_HDR;
	for (size_t i = 0; i < m->msg_iovlen; i++) {
		if (m->msg_iov[i].iov_len)
			memcpy(p, m->msg_iov[i].iov_base, m->msg_iov[i].iov_len);
		p += m->msg_iov[i].iov_len;
	}
	bpq_commit(&s->tx, (uint32_t)(BPD_DGRAM_HDR + len), BPQ_TYPE_DGRAM);
	return 0;
}

static size_t iov_len(const struct msghdr *m)
{
	size_t n = 0;
	for (size_t i = 0; i < m->msg_iovlen; i++)
		n += m->msg_iov[i].iov_len;
	return n;
}

/* send_batch queues v[0..n) and returns how many were queued (or -1 with
 * errno when none was). */
static int send_batch(struct bpd_sock *s, const struct msghdr *const *v, unsigned n,
		      unsigned *lens, int flags)
{
	int err = bpd_sock_usable(s);
	if (!err && atomic_load(&s->shut_wr))
		err = EPIPE;
	if (err) {
		errno = err;
		return -1;
	}
	int nonblock = (flags & MSG_DONTWAIT) || atomic_load(&s->nonblock);
	int64_t deadline = bpd_deadline_of(&s->sndtimeo_us);
	unsigned done = 0;
	pthread_mutex_lock(&s->txmu);
	for (; done < n; done++) {
		struct bpd_addr dst;
		int limit;
		if ((err = destination(s, v[done], &dst, &limit)))
			break;
		size_t len = iov_len(v[done]);
		if (len > (size_t)limit) {
			err = EMSGSIZE;
			break;
		}
		if ((err = put(s, v[done], &dst, len, nonblock, deadline)))
			break;
		if (lens)
			lens[done] = (unsigned)len;
	}
	bpd_sock_kick(s);
	pthread_mutex_unlock(&s->txmu);
	if (done == 0 && err) {
		if (err == EPIPE && !(flags & MSG_NOSIGNAL))
			raise(SIGPIPE);
		errno = err;
		return -1;
	}
	return (int)done;
}

ssize_t bpd_sock_send(struct bpd_sock *s, const struct msghdr *m, int flags)
{
	const struct msghdr *v[1] = {m};
	unsigned len;
	int n = send_batch(s, v, 1, &len, flags);
	return n < 0 ? -1 : (ssize_t)len;
}

int bpd_sock_sendmmsg(struct bpd_sock *s, struct mmsghdr *v, unsigned n, int flags)
{
	enum { CHUNK = 64 };
	const struct msghdr *p[CHUNK];
	unsigned lens[CHUNK], done = 0;
	while (done < n) {
		unsigned k = n - done < CHUNK ? n - done : CHUNK;
		for (unsigned i = 0; i < k; i++)
			p[i] = &v[done + i].msg_hdr;
		int r = send_batch(s, p, k, lens, flags);
		if (r < 0)
			return done ? (int)done : -1;
		for (int i = 0; i < r; i++)
			v[done + (unsigned)i].msg_len = lens[i];
		done += (unsigned)r;
		if ((unsigned)r < k)
			break;
	}
	return (int)done;
}

/* ---- receiving ---- */

/* rx_rearm is called (RX lock held) when the RX queue was found empty: it
 * makes the eventfd unreadable and arms "consumer waiting" for the next
 * datagram, unless one arrived meanwhile (then the eventfd stays readable). */
void bpd_sock_rx_rearm(struct bpd_sock *s)
{
	/* Always read, in both versions: the producer writes the eventfd after
	 * it cleared "waiting", so a write for a datagram already received can
	 * land after the flag was re-armed; skipping the read while the flag is
	 * armed left the fd readable on an empty queue (an edge-triggered epoll
	 * then reported an event after draining). */
	bpd_eventfd_drain(s->rxfd);
	if (bpq_arm_read_wait(&s->rx)) {
		bpq_disarm_read_wait(&s->rx);
		bpd_eventfd_wake(s->rxfd);
	}
}

static void put_cmsg(struct msghdr *m, size_t *used, int level, int type, const void *data,
		     size_t len)
{
	if (!m->msg_control || m->msg_controllen < *used + CMSG_SPACE(len)) {
		m->msg_flags |= MSG_CTRUNC;
		return;
	}
	struct cmsghdr *c = (struct cmsghdr *)((char *)m->msg_control + *used);
	c->cmsg_level = level;
	c->cmsg_type = type;
	c->cmsg_len = CMSG_LEN(len);
	memcpy(CMSG_DATA(c), data, len);
	*used += CMSG_SPACE(len);
}

static void timestamps(struct bpd_sock *s, struct msghdr *m, const uint8_t *hdr)
{
	size_t used = 0;
	uint16_t fl = (uint16_t)(hdr[18] | hdr[19] << 8);
	int64_t sw, hwraw, hwsys;
	memcpy(&sw, hdr + 24, 8);
	memcpy(&hwraw, hdr + 32, 8);
	memcpy(&hwsys, hdr + 40, 8);
	if (!(fl & BPD_TS_SW)) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		sw = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	}
	uint32_t tsf = atomic_load(&s->tsflags);
	if (atomic_load(&s->ts_ns)) {
		struct timespec t = {sw / 1000000000, sw % 1000000000};
		put_cmsg(m, &used, SOL_SOCKET, SCM_TIMESTAMPNS, &t, sizeof(t));
	} else if (atomic_load(&s->ts_us)) {
		struct timeval t = {sw / 1000000000, (sw % 1000000000) / 1000};
		put_cmsg(m, &used, SOL_SOCKET, SCM_TIMESTAMP, &t, sizeof(t));
	}
	if (tsf & (SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_RAW_HARDWARE |
		   SOF_TIMESTAMPING_SYS_HARDWARE)) {
		struct timespec t[3];
		memset(t, 0, sizeof(t));
		if (tsf & SOF_TIMESTAMPING_SOFTWARE) {
			t[0].tv_sec = sw / 1000000000;
			t[0].tv_nsec = sw % 1000000000;
		}
		if ((tsf & SOF_TIMESTAMPING_SYS_HARDWARE) && (fl & BPD_TS_HWSYS)) {
			t[1].tv_sec = hwsys / 1000000000;
			t[1].tv_nsec = hwsys % 1000000000;
		}
		if ((tsf & SOF_TIMESTAMPING_RAW_HARDWARE) && (fl & BPD_TS_HWRAW)) {
			t[2].tv_sec = hwraw / 1000000000;
			t[2].tv_nsec = hwraw % 1000000000;
		}
		put_cmsg(m, &used, SOL_SOCKET, SCM_TIMESTAMPING, t, sizeof(t));
	}
	m->msg_controllen = used;
}

/* take copies the datagram at the head of the RX queue into m. Returns the
 * byte count (or the full length with MSG_TRUNC), -2 for a record to skip. */
static ssize_t take(struct bpd_sock *s, const uint8_t *rec, uint32_t len, uint32_t type,
		    struct msghdr *m, int flags)
{
	if (type != BPQ_TYPE_DGRAM || len < BPD_DGRAM_HDR)
		return -2;
	uint8_t hdr[BPD_DGRAM_HDR];
	memcpy(hdr, rec, BPD_DGRAM_HDR); /* the peer may rewrite it: copy first */
	size_t plen = len - BPD_DGRAM_HDR, off = 0;
	const uint8_t *p = rec + BPD_DGRAM_HDR;
	m->msg_flags = 0;
	for (size_t i = 0; i < m->msg_iovlen && off < plen; i++) {
		size_t k = m->msg_iov[i].iov_len;
		if (k > plen - off)
			k = plen - off;
		if (k)
			memcpy(m->msg_iov[i].iov_base, p + off, k);
		off += k;
	}
	if (off < plen)
		m->msg_flags |= MSG_TRUNC;
	if (m->msg_name) {
		struct bpd_addr a;
		memcpy(a.addr, hdr, 16);
		a.port = (uint16_t)(hdr[16] | hdr[17] << 8);
		struct sockaddr_storage ss;
		socklen_t sl = bpd_addr_to_sockaddr(&a, s->family, &ss);
		memcpy(m->msg_name, &ss, sl < m->msg_namelen ? sl : m->msg_namelen);
		m->msg_namelen = sl;
	}
	if (m->msg_control)
		timestamps(s, m, hdr);
	else
		m->msg_controllen = 0;
	return (flags & MSG_TRUNC) ? (ssize_t)plen : (ssize_t)off;
}

/* recv_one receives one datagram (RX lock held). wait: block as the socket
 * and flags say; otherwise EAGAIN when empty. */
static ssize_t recv_one(struct bpd_sock *s, struct msghdr *m, int flags, int wait,
			int64_t deadline)
{
	int64_t spin_until = -1;
	for (;;) {
		int err = bpd_sock_usable(s);
		if (err) {
			errno = err;
			return -1;
		}
		if (atomic_load(&s->shut_rd))
			return 0;
		const uint8_t *rec;
		uint32_t len, type;
		int q = bpq_peek(&s->rx, &rec, &len, &type);
		if (q == BPQ_OK) {
			ssize_t n = take(s, rec, len, type, m, flags);
			if (n != -2 && (flags & MSG_PEEK))
				return n;
			bpq_advance(&s->rx);
			bpd_sock_rx_release(s);
			if (!bpq_readable(&s->rx))
				bpd_sock_rx_rearm(s);
			if (n == -2)
				continue;
			return n;
		}
		if (q == BPQ_CORRUPT) {
			BPD_LOG(BPD_LOG_ERROR, "socket %u: receive queue corrupt; the socket is unusable", s->id);
			bpd_sock_break(s, EIO);
			continue;
		}
		bpd_sock_rx_rearm(s);
		if (bpq_readable(&s->rx))
			continue;
		if (!wait) {
			errno = EAGAIN;
			return -1;
		}
		if ((err = bpd_sock_rx_wait(s, &spin_until, deadline))) {
			errno = err;
			return -1;
		}
	}
}

void bpd_sock_rx_release(struct bpd_sock *s)
{
	if (!bpq_release(&s->rx))
		return;
	/* The producer waits for room: a version 1 socket's doorbell, or, in
	 * version 2, an announce on the lane, whose engine wakes the stream
	 * socket's pump (a datagram socket's engine never waits for RX room). */
	if (bpd_session_version(s->sess) == 1) {
		if (s->doorbell >= 0)
			bpd_eventfd_wake(s->doorbell);
	} else if (s->type == SOCK_STREAM &&
		   bps_announce(bpd_session_mem(s->sess), s->lane, s->slot))
		bpd_eventfd_wake(bpd_session_doorbell(s->sess, s->lane));
}

int bpd_sock_rx_wait(struct bpd_sock *s, int64_t *spin_until, int64_t deadline)
{
	/* Spin first, as BYPASSD_RX_POLL (or the daemon) says. */
	int poll_us = bpd_session_poll_us(s->sess);
	if (poll_us != 0) {
		int64_t now = bpd_now_us();
		if (*spin_until < 0)
			*spin_until = poll_us < 0 ? INT64_MAX : now + poll_us;
		if (now < *spin_until && (!deadline || now < deadline)) {
			for (int i = 0; i < 64 && !bpq_readable(&s->rx); i++)
				cpu_relax();
			return 0;
		}
	}
	int64_t left = -1;
	if (deadline) {
		left = deadline - bpd_now_us();
		if (left <= 0)
			return EAGAIN;
	}
	int w = wait_cancellable(s->rxfd, left, cancelled_rx, s);
	return w < 0 && errno == EINTR ? EINTR : 0;
}

ssize_t bpd_sock_recv(struct bpd_sock *s, struct msghdr *m, int flags)
{
	int wait = !(flags & MSG_DONTWAIT) && !atomic_load(&s->nonblock);
	int64_t deadline = bpd_deadline_of(&s->rcvtimeo_us);
	pthread_mutex_lock(&s->rxmu);
	ssize_t n = recv_one(s, m, flags, wait, deadline);
	pthread_mutex_unlock(&s->rxmu);
	return n;
}

int bpd_sock_recvmmsg(struct bpd_sock *s, struct mmsghdr *v, unsigned n, int flags,
		      struct timespec *timeout)
{
	int wait = !(flags & MSG_DONTWAIT) && !atomic_load(&s->nonblock);
	int64_t deadline = bpd_deadline_of(&s->rcvtimeo_us);
	if (timeout) {
		int64_t t = bpd_now_us() + timeout->tv_sec * 1000000 + timeout->tv_nsec / 1000;
		if (!deadline || t < deadline)
			deadline = t;
	}
	unsigned done = 0;
	pthread_mutex_lock(&s->rxmu);
	/* The first datagram is waited for; the rest are those already queued
	 * (MSG_WAITFORONE semantics, what event loops use). */
	for (; done < n; done++) {
		ssize_t r = recv_one(s, &v[done].msg_hdr, flags & ~MSG_WAITFORONE, done == 0 && wait,
				     deadline);
		if (r < 0)
			break;
		v[done].msg_len = (unsigned)r;
		if (r == 0 && atomic_load(&s->shut_rd))
			break;
	}
	pthread_mutex_unlock(&s->rxmu);
	if (done == 0)
		return -1;
	return (int)done;
}

int bpd_sock_fionread(struct bpd_sock *s, int *out)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	pthread_mutex_lock(&s->rxmu);
	const uint8_t *rec;
	uint32_t len, type;
	*out = 0;
	if (bpq_peek(&s->rx, &rec, &len, &type) == BPQ_OK && type == BPQ_TYPE_DGRAM &&
	    len >= BPD_DGRAM_HDR)
		*out = (int)(len - BPD_DGRAM_HDR);
	pthread_mutex_unlock(&s->rxmu);
	return 0;
}

/* ---- options ---- */

static int group_request(struct bpd_sock *s, int join, const struct sockaddr *g,
			 const struct sockaddr *src, uint32_t ifindex)
{
	struct bpd_addr ga, sa;
	memset(&sa, 0, sizeof(sa));
	socklen_t gl = g->sa_family == AF_INET ? sizeof(struct sockaddr_in)
						 : sizeof(struct sockaddr_in6);
	int err = bpd_addr_from_sockaddr(g, gl, s->family, &ga);
	if (!err && src)
		err = bpd_addr_from_sockaddr(src, gl, s->family, &sa);
	if (err)
		return err;
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_group(m, join ? BPD_JOIN : BPD_LEAVE, 0, s->id, ga.addr, sa.addr, ifindex);
	return bpd_sock_request(s, m, l, &r);
}

static void sin4(struct sockaddr_in *a, struct in_addr ip)
{
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_addr = ip;
}

static int membership(struct bpd_sock *s, int level, int name, const void *val, socklen_t len)
{
	struct sockaddr_in g4, s4;
	if (level == IPPROTO_IP && (name == IP_ADD_MEMBERSHIP || name == IP_DROP_MEMBERSHIP)) {
		if (len < (socklen_t)sizeof(struct ip_mreq))
			return EINVAL;
		const struct ip_mreqn *mr = val; /* ip_mreq is its prefix */
		uint32_t ifx = len >= (socklen_t)sizeof(struct ip_mreqn) ? (uint32_t)mr->imr_ifindex : 0;
		sin4(&g4, mr->imr_multiaddr);
		return group_request(s, name == IP_ADD_MEMBERSHIP, (struct sockaddr *)&g4, NULL, ifx);
	}
	if (level == IPPROTO_IP &&
	    (name == IP_ADD_SOURCE_MEMBERSHIP || name == IP_DROP_SOURCE_MEMBERSHIP)) {
		if (len < (socklen_t)sizeof(struct ip_mreq_source))
			return EINVAL;
		const struct ip_mreq_source *mr = val;
		sin4(&g4, mr->imr_multiaddr);
		sin4(&s4, mr->imr_sourceaddr);
		return group_request(s, name == IP_ADD_SOURCE_MEMBERSHIP, (struct sockaddr *)&g4,
				     (struct sockaddr *)&s4, 0);
	}
	if (level == IPPROTO_IPV6 && (name == IPV6_ADD_MEMBERSHIP || name == IPV6_DROP_MEMBERSHIP)) {
		if (len < (socklen_t)sizeof(struct ipv6_mreq))
			return EINVAL;
		const struct ipv6_mreq *mr = val;
		struct sockaddr_in6 g6 = {.sin6_family = AF_INET6, .sin6_addr = mr->ipv6mr_multiaddr};
		return group_request(s, name == IPV6_ADD_MEMBERSHIP, (struct sockaddr *)&g6, NULL,
				     mr->ipv6mr_interface);
	}
	if (name == MCAST_JOIN_GROUP || name == MCAST_LEAVE_GROUP) {
		if (len < (socklen_t)sizeof(struct group_req))
			return EINVAL;
		const struct group_req *gr = val;
		return group_request(s, name == MCAST_JOIN_GROUP, (const struct sockaddr *)&gr->gr_group,
				     NULL, gr->gr_interface);
	}
	if (len < (socklen_t)sizeof(struct group_source_req))
		return EINVAL;
	const struct group_source_req *gs = val;
	return group_request(s, name == MCAST_JOIN_SOURCE_GROUP, (const struct sockaddr *)&gs->gsr_group,
			     (const struct sockaddr *)&gs->gsr_source, gs->gsr_interface);
}

/* Options a kernel socket takes that change nothing bypassd does:
 * accepted (and logged at info) so that programs setting them keep working.
 * A stream socket's keepalive and linger are the daemon's (its TCP stack). */
static int ignorable(const struct bpd_sock *s, int level, int name)
{
	if (level == SOL_SOCKET && s->type == SOCK_STREAM &&
	    (name == SO_KEEPALIVE || name == SO_LINGER || name == SO_REUSEADDR))
		return 0; /* SO_REUSEADDR: a restarted listener despite TIME_WAIT */
	if (level == SOL_SOCKET)
		return name == SO_BROADCAST || name == SO_REUSEPORT || name == SO_DONTROUTE || name == SO_RCVLOWAT || name == SO_SNDLOWAT ||
		       name == SO_NO_CHECK || name == SO_BUSY_POLL || name == SO_BINDTODEVICE ||
		       name == SO_KEEPALIVE || name == SO_LINGER || name == SO_ZEROCOPY;
	if (level == IPPROTO_IP)
		return name == IP_RECVERR || name == IP_MTU_DISCOVER || name == IP_MULTICAST_IF ||
		       name == IP_PKTINFO || name == IP_RECVTOS || name == IP_RECVTTL;
	if (level == IPPROTO_IPV6)
		return name == IPV6_RECVERR || name == IPV6_MTU_DISCOVER || name == IPV6_V6ONLY ||
		       name == IPV6_MULTICAST_IF || name == IPV6_RECVPKTINFO;
	return 0;
}

static int opt_int(const void *val, socklen_t len, int *out)
{
	if (!val || len < (socklen_t)sizeof(char))
		return EINVAL;
	if (len >= (socklen_t)sizeof(int))
		memcpy(out, val, sizeof(int));
	else
		*out = *(const unsigned char *)val;
	return 0;
}

static int set_timeout(_Atomic int64_t *t, const void *val, socklen_t len)
{
	struct timeval tv;
	if (!val || len < (socklen_t)sizeof(tv))
		return EINVAL;
	memcpy(&tv, val, sizeof(tv));
	if (tv.tv_usec < 0 || tv.tv_usec >= 1000000)
		return EDOM;
	atomic_store(t, tv.tv_sec < 0 ? 0 : (int64_t)tv.tv_sec * 1000000 + tv.tv_usec);
	return 0;
}

/* local_opt handles the options this library keeps itself, whatever the
 * socket's state. 1 handled (*err set), 0 not a local option. */
static int local_opt(struct bpd_sock *s, int level, int name, const void *val, socklen_t len, int *err)
{
	int v;
	if (level != SOL_SOCKET)
		return 0;
	switch (name) {
	case SO_RCVTIMEO:
		*err = set_timeout(&s->rcvtimeo_us, val, len);
		return 1;
	case SO_SNDTIMEO:
		*err = set_timeout(&s->sndtimeo_us, val, len);
		return 1;
	case SO_TIMESTAMPNS:
		if (!(*err = opt_int(val, len, &v)))
			atomic_store(&s->ts_ns, v != 0);
		return 1;
	case SO_TIMESTAMP:
		if (!(*err = opt_int(val, len, &v)))
			atomic_store(&s->ts_us, v != 0);
		return 1;
	}
	return 0;
}

int bpd_sock_setsockopt(struct bpd_sock *s, int level, int name, const void *val, socklen_t len)
{
	int err, v;
	if (local_opt(s, level, name, val, len, &err))
		return err;
	if (level == SOL_SOCKET && (name == SO_RCVBUFFORCE || name == SO_SNDBUFFORCE))
		name = name == SO_RCVBUFFORCE ? SO_RCVBUF : SO_SNDBUF;
	if (s->state == BPD_PENDING) {
		/* The kernel socket took it already (intercept.c); remember it
		 * for the daemon. */
		if (len > 64 || !val)
			return 0;
		if (level == SOL_SOCKET && name == SO_REUSEADDR && !opt_int(val, len, &v))
			s->reuseaddr = v != 0;
		if (level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_SNDBUF) &&
		    !opt_int(val, len, &v) && v > 0)
			*(name == SO_RCVBUF ? &s->rcvbuf : &s->sndbuf) = (uint32_t)v;
		int i = 0;
		while (i < s->nsaved && !(s->saved[i].level == level && s->saved[i].name == name &&
					  !is_membership(level, name)))
			i++;
		if (i == BPD_MAX_SAVED_OPTS)
			return 0;
		s->saved[i] = (struct bpd_saved_opt){.level = level, .name = name, .len = (uint32_t)len};
		memcpy(s->saved[i].val, val, (size_t)len);
		if (i == s->nsaved)
			s->nsaved++;
		return 0;
	}
	if ((err = bpd_sock_usable(s)))
		return err;
	if (is_membership(level, name))
		return membership(s, level, name, val, len);
	if (ignorable(s, level, name)) {
		BPD_LOG(BPD_LOG_INFO, "socket %u: option %d/%d has no effect on an offloaded socket", s->id,
			level, name);
		return 0;
	}
	if (!val)
		return EFAULT;
	if (len > 64)
		return EINVAL;
	uint32_t l = (uint32_t)len;
	if (level == SOL_SOCKET && (name == SO_TIMESTAMPING || name == SO_TIMESTAMPING_NEW) && l > 4)
		l = 4; /* struct so_timestamping: the flags; bind_phc is not supported */
	if (level == SOL_SOCKET && name == SO_MAX_PACING_RATE && l == 8) {
		/* A u64 rate (newer kernels accept one): the daemon takes a u32. */
		uint64_t r;
		memcpy(&r, val, 8);
		uint32_t r32 = r > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)r;
		err = daemon_setsockopt(s, level, name, &r32, 4);
	} else {
		err = daemon_setsockopt(s, level, name, val, l);
	}
	if (!err && level == SOL_SOCKET && name == SO_LINGER && l >= sizeof(struct linger)) {
		struct linger lg;
		memcpy(&lg, val, sizeof(lg));
		s->linger_on = lg.l_onoff != 0;
		s->linger_secs = lg.l_linger;
	}
	if (!err && level == SOL_SOCKET && (name == SO_TIMESTAMPING || name == SO_TIMESTAMPING_NEW) &&
	    !opt_int(val, len, &v))
		atomic_store(&s->tsflags, (uint32_t)v);
	return err;
}

int bpd_put_opt(void *val, socklen_t *len, const void *data, socklen_t dlen)
{
	if (!len)
		return EINVAL;
	socklen_t n = *len < dlen ? *len : dlen;
	if (n)
		memcpy(val, data, (size_t)n);
	*len = n;
	return 0;
}

int bpd_sock_getsockopt(struct bpd_sock *s, int level, int name, void *val, socklen_t *len)
{
	int v, err;
	struct timeval tv;
	if (s->type == SOCK_STREAM && bpd_stream_getsockopt(s, level, name, val, len, &err))
		return err;
	if (level == SOL_SOCKET) {
		switch (name) {
		case SO_TYPE:
			v = s->type;
			return bpd_put_opt(val, len, &v, sizeof(v));
		case SO_DOMAIN:
			v = s->family;
			return bpd_put_opt(val, len, &v, sizeof(v));
		case SO_PROTOCOL:
			v = s->type == SOCK_STREAM ? IPPROTO_TCP : IPPROTO_UDP;
			return bpd_put_opt(val, len, &v, sizeof(v));
		case SO_ERROR:
		case SO_ACCEPTCONN:
			v = 0;
			return bpd_put_opt(val, len, &v, sizeof(v));
		case SO_RCVTIMEO:
		case SO_SNDTIMEO: {
			int64_t t = atomic_load(name == SO_RCVTIMEO ? &s->rcvtimeo_us : &s->sndtimeo_us);
			tv.tv_sec = t / 1000000;
			tv.tv_usec = t % 1000000;
			return bpd_put_opt(val, len, &tv, sizeof(tv));
		}
		case SO_TIMESTAMPNS:
			v = atomic_load(&s->ts_ns);
			return bpd_put_opt(val, len, &v, sizeof(v));
		case SO_TIMESTAMP:
			v = atomic_load(&s->ts_us);
			return bpd_put_opt(val, len, &v, sizeof(v));
		}
	}
	if ((err = bpd_sock_usable(s)))
		return err;
	uint8_t m[BPD_MSG_MAX], value[64];
	uint32_t vlen;
	struct bpd_reply r;
	size_t l = bpd_enc_getsockopt(m, 0, s->id, level, name);
	if ((err = bpd_sock_request(s, m, l, &r)))
		return err;
	if (bpd_dec_sockopt_val(r.body, r.body_len, value, &vlen))
		return EPROTO;
	if (level == SOL_SOCKET && name == SO_MAX_PACING_RATE && vlen == 20 && len &&
	    (*len == 4 || *len == 8)) {
		/* What a u32 (or u64) getsockopt reads: bytes/s. */
		uint32_t kbps;
		memcpy(&kbps, value, 4);
		uint64_t bps = (uint64_t)kbps * 125;
		if (*len == 8)
			return bpd_put_opt(val, len, &bps, 8);
		uint32_t b32 = kbps == 0 ? 0xFFFFFFFFu : bps > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)bps;
		return bpd_put_opt(val, len, &b32, 4);
	}
	if (len && *len == 1 && vlen == 4) {
		/* A char-sized read of an int option (IP_MULTICAST_TTL/LOOP). */
		uint8_t c = value[0];
		return bpd_put_opt(val, len, &c, 1);
	}
	return bpd_put_opt(val, len, value, (socklen_t)vlen);
}

/* ---- daemon events ---- */

struct sess_err {
	struct bpd_session *sess;
	uint32_t id; /* 0: every socket of sess */
	int err;
};

static void break_one(struct bpd_sock *s, void *arg)
{
	struct sess_err *e = arg;
	if (s->state == BPD_OFFLOADED && s->sess == e->sess && (!e->id || s->id == e->id)) {
		if (e->id)
			BPD_LOG(BPD_LOG_WARN, "bypassd dropped socket %u (%s): calls on it now fail", s->id,
				strerror(e->err));
		bpd_sock_break(s, e->err);
	}
}

void bpd_socks_break_session(struct bpd_session *sess, int err)
{
	struct sess_err e = {sess, 0, err};
	bpd_fd_foreach(break_one, &e);
}

void bpd_socks_socket_error(struct bpd_session *sess, uint32_t id, int err)
{
	struct sess_err e = {sess, id, err};
	bpd_fd_foreach(break_one, &e);
}
