/* One offloaded TCP socket: the byte stream and its events in the socket's
 * two queues (docs/shm-queue.md "Stream records"), connect, listen,
 * accept, shutdown and the options the library answers itself. The
 * daemon's TCP stack holds the connection; sock.c holds what every
 * offloaded socket shares (attaching the queues, announcing TX, waiting).
 *
 * Readiness is sock.c's design: the program's descriptor is the RX
 * eventfd, readable while the RX queue holds a record. For a stream that
 * is data, the peer's FIN (EOF), a failure (ERROR), the handshake's end
 * (CONNECTED) or a connection to accept (ACCEPTABLE). Once a read has seen
 * EOF or an error the eventfd stays readable, as a kernel socket does, so
 * a program polling again gets its 0 or error at once. EPOLLOUT is always
 * reported: the handshake's end is learnt from SO_ERROR, which waits for
 * it (a program that saw the eventfd writable after a non-blocking
 * connect asks SO_ERROR next), and a send to a full queue waits or fails
 * with EAGAIN like a full kernel send buffer.
 */
#include <errno.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "bpd.h"

struct event {
	uint16_t kind;
	uint32_t err;
	struct bpd_addr addr;
};

/* parse_event decodes an event record; -1 for a malformed one. The peer
 * may rewrite the record meanwhile, so it is copied first. */
static int parse_event(const uint8_t *rec, uint32_t len, struct event *e)
{
	uint8_t b[BPD_EVENT_LEN];
	if (len != BPD_EVENT_LEN)
		return -1;
	memcpy(b, rec, sizeof(b));
	e->kind = (uint16_t)(b[0] | b[1] << 8);
	e->addr.port = (uint16_t)(b[2] | b[3] << 8);
	e->err = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
	memcpy(e->addr.addr, b + 8, 16);
	return e->kind >= BPD_EV_CONNECTED && e->kind <= BPD_EV_ACCEPTABLE ? 0 : -1;
}

static int protocol_error(struct bpd_sock *s, const char *what)
{
	BPD_LOG(BPD_LOG_ERROR, "socket %u: bypassd sent %s; the socket is unusable", s->id, what);
	bpd_sock_break(s, EPROTO);
	return EPROTO;
}

/* rx_idle runs (RX lock held) after the receive side consumed records: an
 * empty queue re-arms the eventfd, unless the stream's end was seen, which
 * keeps it readable. */
static void rx_idle(struct bpd_sock *s)
{
	if (atomic_load(&s->forked) || bpq_readable(&s->rx)) /* a fork child has no queues */
		return;
	if (s->rd_eof || s->rd_err || atomic_load(&s->shut_rd))
		bpd_eventfd_wake(s->rxfd);
	else
		bpd_sock_rx_rearm(s);
}

/* consume advances past the head record and frees its room. */
static void consume(struct bpd_sock *s)
{
	bpq_advance(&s->rx);
	bpd_sock_rx_release(s);
}

/* settle takes a connecting socket's outcome if it arrived (RX lock). */
static void settle(struct bpd_sock *s)
{
	if (!atomic_load(&s->connecting) || atomic_load(&s->forked))
		return;
	const uint8_t *rec;
	uint32_t len, type;
	int q = bpq_peek(&s->rx, &rec, &len, &type);
	if (q == BPQ_CORRUPT) {
		protocol_error(s, "a corrupt receive queue");
		return;
	}
	if (q != BPQ_OK)
		return;
	struct event e;
	if (type != BPD_REC_EVENT || parse_event(rec, len, &e) ||
	    (e.kind != BPD_EV_CONNECTED && e.kind != BPD_EV_ERROR)) {
		protocol_error(s, "a record before the handshake's end");
		return;
	}
	consume(s);
	if (e.kind == BPD_EV_CONNECTED) {
		s->laddr = e.addr;
		s->connected = 1;
	} else {
		atomic_store(&s->conn_err, e.err ? (int)e.err : ECONNREFUSED);
	}
	atomic_store(&s->connecting, 0);
	rx_idle(s);
}

/* await_connect waits until a handshake in progress ended. 0, or EAGAIN
 * at the deadline, EINTR, or the socket's errno. */
static int await_connect(struct bpd_sock *s, int64_t deadline)
{
	int err = 0;
	int64_t spin = -1;
	pthread_mutex_lock(&s->rxmu);
	for (;;) {
		settle(s);
		if (!atomic_load(&s->connecting) || (err = bpd_sock_usable(s)))
			break;
		bpd_sock_rx_rearm(s);
		if (bpq_readable(&s->rx))
			continue;
		if ((err = bpd_sock_rx_wait(s, &spin, deadline)))
			break;
	}
	pthread_mutex_unlock(&s->rxmu);
	return err;
}

int bpd_stream_connected(struct bpd_sock *s)
{
	if (atomic_load(&s->nonblock))
		return EINPROGRESS;
	int err = await_connect(s, bpd_deadline_of(&s->sndtimeo_us));
	if (err == EAGAIN)
		return EINPROGRESS; /* SO_SNDTIMEO passed: the handshake goes on, as in Linux */
	if (err)
		return err;
	return atomic_exchange(&s->conn_err, 0);
}

int bpd_stream_connect(struct bpd_sock *s, const struct bpd_addr *remote)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	if (atomic_load(&s->listening) || s->connected)
		return EISCONN;
	if (atomic_load(&s->connecting)) {
		if (atomic_load(&s->nonblock)) {
			pthread_mutex_lock(&s->rxmu);
			settle(s);
			pthread_mutex_unlock(&s->rxmu);
			if (atomic_load(&s->connecting))
				return EALREADY;
			return s->connected ? 0 : atomic_exchange(&s->conn_err, 0);
		}
		return bpd_stream_connected(s);
	}
	if ((err = atomic_exchange(&s->conn_err, 0)))
		return err; /* the last attempt's failure, not reported yet */
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_addrport(m, BPD_CONNECT, 0, s->id, remote, 0);
	pthread_mutex_lock(&s->mu);
	err = bpd_sock_request(s, m, l, &r);
	pthread_mutex_unlock(&s->mu);
	if (err)
		return err;
	s->raddr = *remote;
	atomic_store(&s->connecting, 1);
	return bpd_stream_connected(s);
}

int bpd_stream_listen(struct bpd_sock *s, int backlog)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	if (s->connected || atomic_load(&s->connecting))
		return EINVAL;
	if (atomic_load(&s->listening))
		return 0; /* Linux lets a listener change its backlog; the daemon keeps its own */
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	/* 0 is the daemon's default (4096): listen(fd, 0) still takes one. */
	size_t l = bpd_enc_u32(m, BPD_LISTEN, 0, s->id, backlog <= 0 ? 1u : (uint32_t)backlog);
	pthread_mutex_lock(&s->mu);
	err = bpd_sock_request(s, m, l, &r);
	if (!err && bpd_dec_addrport(r.body, r.body_len, &s->laddr))
		err = EPROTO;
	pthread_mutex_unlock(&s->mu);
	if (!err)
		atomic_store(&s->listening, 1);
	return err;
}

/* take_accepted asks the daemon for one announced connection. */
static int take_accepted(struct bpd_sock *s, struct bpd_sock **out)
{
	uint8_t m[BPD_MSG_MAX];
	struct bpd_reply r;
	size_t l = bpd_enc_u32(m, BPD_ACCEPT, 0, s->id, bpd_cfg.queue_bytes);
	int err = bpd_call(s->sess, m, l, &r);
	if (err)
		return err;
	if (r.h.code != (BPD_ACCEPT | BPD_REPLY_BIT) || (!r.h.status && !r.h.socket))
		err = EPROTO;
	else
		err = r.h.status;
	struct bpd_sock *n = NULL;
	struct bpd_open_reply o;
	if (!err && !(n = bpd_sock_new(s->family, SOCK_STREAM, 0)))
		err = ENOMEM;
	if (!err && bpd_dec_accept_reply(r.body, r.body_len, bpd_session_version(s->sess), &o,
					 &n->raddr, &n->laddr))
		err = EPROTO;
	if (err) {
		for (int i = 0; i < r.nfds; i++)
			bpd_sys_close(r.fds[i]);
	} else {
		n->sess = s->sess;
		n->id = r.h.socket;
		r.body_len = 32; /* the reply begins with an OPEN reply */
		err = bpd_sock_attach(n, &r);
	}
	if (err && r.h.socket && !r.h.status) {
		l = bpd_enc_close(m, 0, r.h.socket); /* the daemon would keep it till the session ends */
		struct bpd_reply cr;
		(void)bpd_call(s->sess, m, l, &cr);
	}
	if (err) {
		if (n) {
			n->sess = NULL;
			bpd_sock_unref(n);
		}
		return err;
	}
	n->state = BPD_OFFLOADED;
	n->bound = n->connected = 1;
	/* Options the program set on the listener the daemon gave the
	 * connection already; the library's own ones are inherited here. */
	n->rcvtimeo_us = atomic_load(&s->rcvtimeo_us);
	n->sndtimeo_us = atomic_load(&s->sndtimeo_us);
	n->linger_on = s->linger_on;
	n->linger_secs = s->linger_secs;
	pthread_mutex_lock(&n->rxmu);
	bpd_sock_rx_rearm(n); /* readable if the peer's first bytes are there */
	pthread_mutex_unlock(&n->rxmu);
	*out = n;
	return 0;
}

int bpd_stream_accept(struct bpd_sock *s, int nonblock, struct bpd_sock **out)
{
	if (!atomic_load(&s->listening))
		return EINVAL;
	int64_t deadline = bpd_deadline_of(&s->rcvtimeo_us), spin = -1;
	int err;
	pthread_mutex_lock(&s->rxmu);
	for (;;) {
		if ((err = bpd_sock_usable(s)))
			break;
		const uint8_t *rec;
		uint32_t len, type;
		int q = bpq_peek(&s->rx, &rec, &len, &type);
		if (q == BPQ_OK) {
			struct event e;
			if (type != BPD_REC_EVENT || parse_event(rec, len, &e) || e.kind != BPD_EV_ACCEPTABLE) {
				err = protocol_error(s, "a listening socket a record other than ACCEPTABLE");
				break;
			}
			consume(s);
			err = take_accepted(s, out);
			if (err == EAGAIN)
				continue; /* the daemon reset it meanwhile: wait for the next */
			break;
		}
		if (q == BPQ_CORRUPT) {
			err = protocol_error(s, "a corrupt receive queue");
			break;
		}
		bpd_sock_rx_rearm(s);
		if (bpq_readable(&s->rx))
			continue;
		if (nonblock) {
			err = EAGAIN;
			break;
		}
		if ((err = bpd_sock_rx_wait(s, &spin, deadline)))
			break;
	}
	rx_idle(s);
	pthread_mutex_unlock(&s->rxmu);
	return err;
}

/* iov_cursor walks a msghdr's iovecs. */
struct iov_cursor {
	const struct msghdr *m;
	size_t i, off;
};

static size_t iov_total(const struct msghdr *m)
{
	size_t n = 0;
	for (size_t i = 0; i < m->msg_iovlen; i++)
		n += m->msg_iov[i].iov_len;
	return n;
}

/* iov_move copies n bytes between the iovecs (at the cursor, which
 * advances) and buf: out = 1 copies from the iovecs into buf. */
static void iov_move(struct iov_cursor *c, uint8_t *buf, size_t n, int out)
{
	while (n && c->i < c->m->msg_iovlen) {
		const struct iovec *v = &c->m->msg_iov[c->i];
		size_t k = v->iov_len - c->off;
		if (k > n)
			k = n;
		if (k) {
			uint8_t *p = (uint8_t *)v->iov_base + c->off;
			memcpy(out ? buf : p, out ? p : buf, k);
		}
		buf += k;
		n -= k;
		c->off += k;
		if (c->off == v->iov_len) {
			c->i++;
			c->off = 0;
		}
	}
}

/* tx_failed: the connection failed and the daemon takes no more bytes
 * (its TX queue's consumer error): its errno the first time the failure
 * is reported (here or by a read), then EPIPE, as a kernel socket's
 * writes after a reset. 0 while the connection is usable. */
static int tx_failed(struct bpd_sock *s)
{
	int e = s->tx.cons_err ? (int)atomic_load(s->tx.cons_err) : 0;
	if (!e)
		return 0;
	atomic_store(&s->shut_wr, 1);
	if (atomic_exchange(&s->err_reported, 1))
		return EPIPE;
	atomic_store(&s->conn_err, 0); /* SO_ERROR is read with it, as sk_err */
	return e;
}

ssize_t bpd_stream_send(struct bpd_sock *s, const struct msghdr *m, int flags)
{
	int err = bpd_sock_usable(s);
	if (!err)
		err = tx_failed(s);
	if (!err && atomic_load(&s->shut_wr))
		err = EPIPE;
	if (!err && !s->connected && !atomic_load(&s->connecting)) {
		err = atomic_exchange(&s->conn_err, 0);
		if (!err)
			err = ENOTCONN;
	}
	if (err) {
		if (err == EPIPE && !(flags & MSG_NOSIGNAL))
			raise(SIGPIPE);
		errno = err;
		return -1;
	}
	size_t total = iov_total(m), sent = 0;
	if (!total)
		return 0;
	int nonblock = (flags & MSG_DONTWAIT) || atomic_load(&s->nonblock);
	int64_t deadline = bpd_deadline_of(&s->sndtimeo_us);
	struct iov_cursor c = {m, 0, 0};
	/* Bytes written while the handshake goes on wait in the queue: the
	 * daemon sends them once it is established. */
	pthread_mutex_lock(&s->txmu);
	while (sent < total) {
		if ((err = tx_failed(s)))
			break;
		uint32_t chunk = total - sent < s->max_payload ? (uint32_t)(total - sent) : s->max_payload;
		uint8_t *rec;
		int q = bpq_reserve(&s->tx, chunk, &rec);
		if (q == BPQ_FULL && chunk > 4096) {
			chunk = 4096; /* take the room there is rather than wait for a big record's */
			q = bpq_reserve(&s->tx, chunk, &rec);
		}
		if (q == BPQ_OK) {
			iov_move(&c, rec, chunk, 1);
			bpq_commit(&s->tx, chunk, BPD_REC_DATA);
			sent += chunk;
			continue;
		}
		if (q != BPQ_FULL) {
			err = protocol_error(s, "a corrupt send queue");
			break;
		}
		bpd_sock_kick(s);
		if (nonblock) {
			err = EAGAIN;
			break;
		}
		if ((err = bpd_sock_wait_room(s, chunk, deadline)))
			break;
	}
	bpd_sock_kick(s);
	pthread_mutex_unlock(&s->txmu);
	if (sent)
		return (ssize_t)sent;
	if (err == EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	errno = err;
	return -1;
}

ssize_t bpd_stream_recv(struct bpd_sock *s, struct msghdr *m, int flags)
{
	int wait = !(flags & MSG_DONTWAIT) && !atomic_load(&s->nonblock);
	int peek = (flags & MSG_PEEK) != 0;
	int waitall = (flags & MSG_WAITALL) && wait && !peek;
	int64_t deadline = bpd_deadline_of(&s->rcvtimeo_us), spin = -1;
	size_t total = iov_total(m), n = 0;
	struct iov_cursor c = {m, 0, 0};
	m->msg_flags = 0;
	m->msg_controllen = 0;
	if (m->msg_name)
		m->msg_namelen = 0; /* a stream's bytes come from its peer */
	if (atomic_load(&s->listening)) {
		errno = ENOTCONN;
		return -1;
	}
	int err = 0;
	pthread_mutex_lock(&s->rxmu);
	for (;;) {
		if ((err = bpd_sock_usable(s)))
			break;
		settle(s);
		if (atomic_load(&s->shut_rd) || s->rd_eof)
			break;
		if (s->rd_err) {
			if (n)
				break;
			err = s->rd_err; /* reported once; then the stream has ended */
			s->rd_eof = 1;
			s->rd_err = 0;
			atomic_store(&s->conn_err, 0);
			break;
		}
		if (!s->connected && !atomic_load(&s->connecting)) {
			if (!(err = atomic_exchange(&s->conn_err, 0)))
				err = ENOTCONN;
			break;
		}
		if (!total)
			break;
		if (!atomic_load(&s->connecting)) {
			const uint8_t *rec;
			uint32_t len, type;
			int q = bpq_peek(&s->rx, &rec, &len, &type);
			if (q == BPQ_OK && type == BPD_REC_DATA && s->rx_off < len) {
				size_t k = len - s->rx_off;
				if (k > total - n)
					k = total - n;
				iov_move(&c, (uint8_t *)rec + s->rx_off, k, 0);
				n += k;
				if (peek)
					break; /* MSG_PEEK: what the head record holds */
				s->rx_off += (uint32_t)k;
				if (s->rx_off == len) {
					consume(s);
					s->rx_off = 0;
				}
				if (n == total)
					break;
				continue;
			}
			if (q == BPQ_OK) {
				struct event e;
				if (type != BPD_REC_EVENT || parse_event(rec, len, &e) ||
				    (e.kind != BPD_EV_EOF && e.kind != BPD_EV_ERROR)) {
					err = protocol_error(s, "an unexpected record in a connection's stream");
					break;
				}
				consume(s);
				if (e.kind == BPD_EV_EOF || atomic_exchange(&s->err_reported, 1)) {
					/* The end, or a failure a write reported. */
					s->rd_eof = 1;
					if (e.kind != BPD_EV_EOF)
						atomic_store(&s->shut_wr, 1);
				} else {
					/* Reset or timed out: reads report it once,
					 * SO_ERROR too, writes fail with EPIPE. */
					s->rd_err = e.err ? (int)e.err : ECONNRESET;
					atomic_store(&s->conn_err, s->rd_err);
					atomic_store(&s->shut_wr, 1);
				}
				continue;
			}
			if (q == BPQ_CORRUPT) {
				err = protocol_error(s, "a corrupt receive queue");
				break;
			}
		}
		if (n && !waitall)
			break;
		bpd_sock_rx_rearm(s);
		if (bpq_readable(&s->rx))
			continue;
		if (!wait) {
			if (!n)
				err = EAGAIN;
			break;
		}
		if ((err = bpd_sock_rx_wait(s, &spin, deadline)))
			break;
	}
	rx_idle(s);
	pthread_mutex_unlock(&s->rxmu);
	if (n)
		return (ssize_t)n; /* what arrived before a signal, timeout or the end */
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

int bpd_stream_shutdown(struct bpd_sock *s, int how)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	if (how < SHUT_RD || how > SHUT_RDWR)
		return EINVAL;
	if (!s->connected && !atomic_load(&s->connecting))
		return ENOTCONN;
	if (how != SHUT_WR) {
		atomic_store(&s->shut_rd, 1);
		bpd_eventfd_wake(s->rxfd); /* readers return 0 at once */
	}
	if (how == SHUT_RD || atomic_exchange(&s->shut_wr, 1))
		return 0;
	/* The end of writing is an EOF record after the bytes before it: the
	 * daemon sends FIN once they are out. */
	pthread_mutex_lock(&s->txmu);
	for (;;) {
		uint8_t *rec;
		int q = bpq_reserve(&s->tx, BPD_EVENT_LEN, &rec);
		if (q == BPQ_OK) {
			memset(rec, 0, BPD_EVENT_LEN);
			rec[0] = BPD_EV_EOF;
			bpq_commit(&s->tx, BPD_EVENT_LEN, BPD_REC_EVENT);
			break;
		}
		if (q != BPQ_FULL) {
			err = protocol_error(s, "a corrupt send queue");
			break;
		}
		bpd_sock_kick(s);
		if ((err = bpd_sock_wait_room(s, BPD_EVENT_LEN, 0)))
			break;
	}
	bpd_sock_kick(s);
	pthread_mutex_unlock(&s->txmu);
	return err;
}

uint32_t bpd_stream_events(struct bpd_sock *s)
{
	if (s->state != BPD_OFFLOADED || s->type != SOCK_STREAM)
		return 0;
	/* A handshake's end is taken here too, if no reader holds the
	 * receive side (one blocked in a call would hold it while waiting). */
	if (atomic_load(&s->connecting) && !pthread_mutex_trylock(&s->rxmu)) {
		settle(s);
		pthread_mutex_unlock(&s->rxmu);
	}
	uint32_t ev = 0;
	int eof = s->rd_eof || s->rd_err, wr = atomic_load(&s->shut_wr);
	if (eof || atomic_load(&s->shut_rd))
		ev |= EPOLLRDHUP | EPOLLIN;
	if (eof && wr)
		ev |= EPOLLHUP; /* both directions ended (or reset) */
	if (atomic_load(&s->conn_err))
		ev |= EPOLLERR;
	if (!s->connected && !atomic_load(&s->connecting) && !atomic_load(&s->listening))
		ev |= EPOLLHUP; /* a failed handshake: nothing will come */
	return ev;
}

void bpd_stream_settle(struct bpd_sock *s)
{
	if (!atomic_load(&s->connecting))
		return;
	pthread_mutex_lock(&s->rxmu);
	settle(s);
	pthread_mutex_unlock(&s->rxmu);
}

int bpd_stream_fionread(struct bpd_sock *s, int *out)
{
	int err = bpd_sock_usable(s);
	if (err)
		return err;
	const uint8_t *rec;
	uint32_t len, type;
	*out = 0;
	pthread_mutex_lock(&s->rxmu);
	settle(s);
	if (s->connected && bpq_peek(&s->rx, &rec, &len, &type) == BPQ_OK && type == BPD_REC_DATA &&
	    s->rx_off < len)
		*out = (int)(len - s->rx_off); /* the head record: a lower bound, as FIONREAD may be */
	pthread_mutex_unlock(&s->rxmu);
	return 0;
}

int bpd_stream_getsockopt(struct bpd_sock *s, int level, int name, void *val, socklen_t *len,
			  int *err)
{
	int v;
	if (level == SOL_SOCKET && name == SO_ERROR) {
		/* After a non-blocking connect the program saw the descriptor
		 * writable (it always is) and asks how the handshake ended:
		 * wait for the end. */
		if (atomic_load(&s->connecting))
			(void)await_connect(s, bpd_deadline_of(&s->sndtimeo_us));
		v = atomic_exchange(&s->conn_err, 0);
		*err = bpd_put_opt(val, len, &v, sizeof(v));
		return 1;
	}
	if (level == SOL_SOCKET && name == SO_ACCEPTCONN) {
		v = atomic_load(&s->listening);
		*err = bpd_put_opt(val, len, &v, sizeof(v));
		return 1;
	}
	if (level == IPPROTO_TCP && name == TCP_INFO) {
		/* The state only (the daemon's stack keeps the rest; bypassctl
		 * shows it): programs that log TCP_INFO keep working. */
		struct tcp_info ti;
		memset(&ti, 0, sizeof(ti));
		bpd_stream_settle(s);
		ti.tcpi_state = atomic_load(&s->listening) ? TCP_LISTEN
				: s->connected		   ? TCP_ESTABLISHED
				: atomic_load(&s->connecting) ? TCP_SYN_SENT
							      : TCP_CLOSE;
		*err = bpd_put_opt(val, len, &ti, sizeof(ti));
		return 1;
	}
	return 0;
}
