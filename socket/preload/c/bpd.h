/* libbypassd internals: declarations shared by the library's files and its
 * unit tests. Nothing here is a public API; the library's only interface is
 * the libc symbols it interposes (intercept.c).
 *
 * Layers, bottom up:
 *   proto.c   control messages (docs/protocol.md): encode, decode, validate
 *   queue.c   the shared-memory SPSC queue (docs/shm-queue.md)
 *   sessmem.c the session memory of protocol version 2: layout, bitmaps
 *   rules.c   which sockets are offloaded (BYPASSD_RULES, docs/preload.md)
 *   log.c     BYPASSD_LOG_LEVEL / BYPASSD_LOG_FILE
 *   session.c the control connection and its monitor thread
 *   sock.c    one offloaded socket: open, send, receive, wait, options
 *   stream.c  what a stream (TCP) socket adds: connect, listen, accept,
 *             the byte stream and its events
 *   mux.c     poll/epoll: the events an eventfd cannot carry (RDHUP, HUP, ERR)
 *   intercept.c  the libc entry points and the fd table
 */
#ifndef BPD_H
#define BPD_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#define BPD_HIDDEN __attribute__((visibility("hidden")))

/* ---- control protocol (proto.c) ---------------------------------------- */

enum {
	BPD_PROTO_MIN = 1, /* versions this library speaks (the daemon picks) */
	BPD_PROTO_MAX = 2,
	BPD_HDR_LEN = 16,
	BPD_MSG_MAX = 512,
	BPD_REPLY_BIT = 0x8000,
	BPD_OPEN_FDS = 4,      /* version 1: a successful OPEN reply's descriptors */
	BPD_MAX_FDS = 2 + 64,  /* version 2: a HELLO reply's, at most */
	BPD_FD_MEMFD = 0,
	BPD_FD_RXWAIT = 1,
	BPD_FD_TXWAIT = 2,
	BPD_FD_DOORBELL = 3,
	BPD_BIND_REUSEADDR = 1,
	BPD_MIN_QUEUE = 4096,
	BPD_MAX_QUEUE = 16 << 20,
};

enum bpd_code {
	BPD_HELLO = 1,
	BPD_OPEN = 2,
	BPD_BIND = 3,
	BPD_CONNECT = 4,
	BPD_SETSOCKOPT = 5,
	BPD_GETSOCKOPT = 6,
	BPD_JOIN = 7,
	BPD_LEAVE = 8,
	BPD_CLOSE = 9,
	BPD_LISTEN = 24,
	BPD_ACCEPT = 25,
	BPD_SHUTDOWN = 16,
	BPD_SOCKET_ERROR = 17,
};

struct bpd_hdr {
	uint16_t code, version;
	uint32_t req_id;
	int32_t status;
	uint32_t socket;
};

/* The header version requests carry: the version the current session
 * speaks (set by HELLO; BPD_PROTO_MAX before). */
BPD_HIDDEN extern _Atomic int bpd_proto_version;

struct bpd_hello_reply {
	uint16_t version, lanes; /* lanes: version 2 */
	uint32_t daemon_pid, max_sockets, default_queue_bytes;
	int32_t rx_poll_us;
	uint64_t session_size; /* version 2 */
};

struct bpd_open_reply {
	uint32_t queue_bytes;
	uint64_t memfd_size; /* version 1 */
	uint64_t tx_offset, rx_offset;
	uint32_t slot; /* version 2 */
	uint16_t lane; /* version 2 */
};

/* An address as the protocol carries it: 16 bytes (IPv4 v4-mapped) and a
 * host-order port. */
struct bpd_addr {
	uint8_t addr[16];
	uint16_t port;
};

/* Encoders return the message length (header + body). buf has BPD_MSG_MAX
 * bytes. */
BPD_HIDDEN size_t bpd_enc_hello(uint8_t *buf, uint32_t req, const char *name, int version);
BPD_HIDDEN size_t bpd_enc_open(uint8_t *buf, uint32_t req, uint16_t family, int type,
			       uint32_t queue_bytes);
BPD_HIDDEN size_t bpd_enc_u32(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock, uint32_t v);
BPD_HIDDEN size_t bpd_enc_addrport(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock,
				   const struct bpd_addr *a, uint16_t flags);
BPD_HIDDEN size_t bpd_enc_setsockopt(uint8_t *buf, uint32_t req, uint32_t sock, int32_t level,
				     int32_t name, const void *val, uint32_t len);
BPD_HIDDEN size_t bpd_enc_getsockopt(uint8_t *buf, uint32_t req, uint32_t sock, int32_t level,
				     int32_t name);
BPD_HIDDEN size_t bpd_enc_group(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock,
				const uint8_t group[16], const uint8_t source[16], uint32_t ifindex);
BPD_HIDDEN size_t bpd_enc_close(uint8_t *buf, uint32_t req, uint32_t sock);

/* bpd_dec_hdr checks the header rules every message obeys (length, version
 * = bpd_proto_version, status range, reply bit). 0 or an errno;
 * EPROTONOSUPPORT with h filled for another version. */
BPD_HIDDEN int bpd_dec_hdr(const uint8_t *buf, size_t len, struct bpd_hdr *h);
/* Body decoders take the body (after the header) and check its length and
 * reserved fields for the given version. 0 or EPROTO. */
BPD_HIDDEN int bpd_dec_hello_reply(const uint8_t *b, size_t len, int version,
				   struct bpd_hello_reply *r);
BPD_HIDDEN int bpd_dec_open_reply(const uint8_t *b, size_t len, int version,
				  struct bpd_open_reply *r);
BPD_HIDDEN int bpd_dec_addrport(const uint8_t *b, size_t len, struct bpd_addr *a);
/* ACCEPT's reply: an OPEN reply of the version, the peer, the local address. */
BPD_HIDDEN int bpd_dec_accept_reply(const uint8_t *b, size_t len, int version,
				    struct bpd_open_reply *o, struct bpd_addr *peer,
				    struct bpd_addr *local);
BPD_HIDDEN int bpd_dec_sockopt_val(const uint8_t *b, size_t len, uint8_t val[64], uint32_t *vlen);
BPD_HIDDEN int bpd_dec_u32(const uint8_t *b, size_t len, uint32_t *v);

/* sockaddr <-> protocol address. to_bpd: 0 or EAFNOSUPPORT/EINVAL. */
BPD_HIDDEN int bpd_addr_from_sockaddr(const struct sockaddr *sa, socklen_t len, int family,
				      struct bpd_addr *a);
BPD_HIDDEN socklen_t bpd_addr_to_sockaddr(const struct bpd_addr *a, int family,
					  struct sockaddr_storage *ss);
BPD_HIDDEN int bpd_addr_is_zero(const struct bpd_addr *a);

/* ---- shared-memory queue (queue.c) -------------------------------------- */

enum {
	BPQ_HEADER = 256,
	BPQ_RECHDR = 8,
	BPQ_TYPE_PAD = 0xFFFFFFFFu,
	BPQ_TYPE_DGRAM = 1,
	BPQ_MAGIC = 0x51445042,
	BPQ_VERSION = 1,
};

/* Datagram record header (internal/dgram), 48 bytes before the payload. */
enum { BPD_DGRAM_HDR = 48, BPD_TS_SW = 1, BPD_TS_HWRAW = 2, BPD_TS_HWSYS = 4 };

struct bpq {
	uint8_t *data; /* the data area (header + 256) */
	_Atomic uint64_t *prod, *cons, *dropped;
	_Atomic uint32_t *cons_waiting, *prod_waiting;
	_Atomic uint32_t *cons_err; /* the consumer's errno once it stopped for good */
	uint64_t cap, mask;
	uint32_t max_payload;
	/* producer side */
	uint64_t p_idx, p_pub, p_cons;
	uint64_t res_off;
	/* consumer side */
	uint64_t c_idx, c_rel, c_prod;
	uint64_t peek_total, peek_off;
	uint32_t peek_len, peek_type;
	int corrupt;
};

enum { BPQ_OK = 0, BPQ_EMPTY = 1, BPQ_FULL = 2, BPQ_TOOBIG = 3, BPQ_CORRUPT = 4 };

BPD_HIDDEN int bpq_init(struct bpq *q, void *mem, uint64_t memlen, uint64_t cap);
BPD_HIDDEN int bpq_attach(struct bpq *q, void *mem, uint64_t memlen);
/* Producer. reserve returns a pointer to n payload bytes in *out. */
BPD_HIDDEN int bpq_reserve(struct bpq *q, uint32_t n, uint8_t **out);
BPD_HIDDEN void bpq_commit(struct bpq *q, uint32_t n, uint32_t type);
/* publish: 1 when the consumer was waiting and must be woken. */
BPD_HIDDEN int bpq_publish(struct bpq *q);
BPD_HIDDEN int bpq_arm_write_wait(struct bpq *q, uint32_t n); /* 1: room now */
BPD_HIDDEN void bpq_disarm_write_wait(struct bpq *q);
/* Consumer. peek returns the record's payload (valid until advance). */
BPD_HIDDEN int bpq_peek(struct bpq *q, const uint8_t **rec, uint32_t *len, uint32_t *type);
BPD_HIDDEN void bpq_advance(struct bpq *q);
/* release: 1 when the producer was waiting for room and must be woken. */
BPD_HIDDEN int bpq_release(struct bpq *q);
/* readable: 1 when a record (or corruption) is there to peek. */
BPD_HIDDEN int bpq_readable(struct bpq *q);
/* arm_read_wait: sets consumer waiting (seq_cst) and re-checks; 1 when the
 * queue is no longer empty (the caller must not sleep). */
BPD_HIDDEN int bpq_arm_read_wait(struct bpq *q);
BPD_HIDDEN int bpq_disarm_read_wait(struct bpq *q); /* returns the old flag */

/* ---- session memory of protocol version 2 (sessmem.c) ------------------
 * Held to internal/shmsess by the golden test. */

enum {
	BPS_MAGIC = 0x53445042,
	BPS_HEADER = 4096,
	BPS_PAGE = 4096,
	BPS_MAX_SLOTS = 64 * 64 * 64,
	BPS_MAX_LANES = 64,
};

struct bps_layout {
	uint64_t words, mids, bitmap_size, events_offset, lanes_offset, lane_stride, arena_offset,
		arena_size, size;
};

struct bps_bitmap {
	_Atomic uint64_t *summary, *mid, *leaf;
	uint64_t mids, words;
	uint32_t slots;
};

struct bps {
	uint8_t *mem;
	struct bps_layout l;
	uint32_t slots, lanes;
	_Atomic uint32_t *client_sleeping;
	struct bps_bitmap events;
	struct {
		_Atomic uint32_t *engine_sleeping;
		struct bps_bitmap announce;
	} lane[BPS_MAX_LANES];
};

/* bps_layout computes the layout of slots sockets, lanes lanes and an
 * arena of arena bytes; -1 when out of range. */
BPD_HIDDEN int bps_layout(uint32_t slots, uint32_t lanes, uint64_t arena, struct bps_layout *l);
/* bps_attach validates a mapped session memory of size bytes against the
 * HELLO reply's slots and lanes: 0, or -1 when anything disagrees. */
BPD_HIDDEN int bps_attach(struct bps *s, void *mem, uint64_t size, uint32_t slots, uint32_t lanes);
BPD_HIDDEN void bps_set(struct bps_bitmap *b, uint32_t slot);
BPD_HIDDEN int bps_pending(struct bps_bitmap *b);
/* bps_drain visits every slot set (each at most once per drain). */
BPD_HIDDEN int bps_drain(struct bps_bitmap *b, void (*visit)(uint32_t slot, void *arg), void *arg);
/* bps_announce: 1 when the lane's engine sleeps and its doorbell must be
 * written. */
BPD_HIDDEN int bps_announce(struct bps *s, uint32_t lane, uint32_t slot);
/* bps_arm_client_sleep: 1 when events are pending (do not sleep). */
BPD_HIDDEN int bps_arm_client_sleep(struct bps *s);
BPD_HIDDEN void bps_disarm_client_sleep(struct bps *s);
/* bps_queue_ok: a queue of queue_bytes at off lies inside the arena. */
BPD_HIDDEN int bps_queue_ok(const struct bps *s, uint64_t off, uint32_t queue_bytes);

/* ---- logging (log.c) ---------------------------------------------------- */

enum { BPD_LOG_ERROR = 0, BPD_LOG_WARN = 1, BPD_LOG_INFO = 2, BPD_LOG_DEBUG = 3 };
BPD_HIDDEN extern int bpd_log_level;
BPD_HIDDEN void bpd_log_init(void);
BPD_HIDDEN void bpd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define BPD_LOG(lvl, ...)                                                                      \
	do {                                                                                   \
		if ((lvl) <= bpd_log_level)                                                    \
			bpd_log((lvl), __VA_ARGS__);                                           \
	} while (0)
BPD_HIDDEN const char *bpd_fmt_addr(const struct bpd_addr *a, char *buf, size_t n);

/* ---- rules (rules.c) ---------------------------------------------------- */

enum { BPD_RULE_OFFLOAD = 1, BPD_RULE_KERNEL = 2 };

struct bpd_prefix {
	int any; /* address "*" */
	uint8_t addr[16];
	int bits; /* prefix length in the 128-bit (v4-mapped) space */
	uint16_t port_lo, port_hi;
};

struct bpd_rule {
	int action;
	char program[64]; /* empty: any */
	int has_local, has_remote;
	struct bpd_prefix local, remote;
};

struct bpd_rules {
	struct bpd_rule *r;
	int n;
	int dflt; /* action when nothing matches */
};

/* Parses text (rules separated by ';' or newlines, '#' comments). 0 or -1
 * with a message in err. */
BPD_HIDDEN int bpd_rules_parse(struct bpd_rules *rs, const char *text, char *err, size_t errlen);
BPD_HIDDEN void bpd_rules_free(struct bpd_rules *rs);
/* local/remote may be NULL (unknown). Returns BPD_RULE_OFFLOAD or _KERNEL. */
BPD_HIDDEN int bpd_rules_match(const struct bpd_rules *rs, const char *program,
			       const struct bpd_addr *local, const struct bpd_addr *remote);

/* ---- configuration (intercept.c reads the environment once) ------------- */

struct bpd_config {
	char socket_path[108];
	int require;     /* BYPASSD_REQUIRE=1 */
	int rx_poll_us;  /* BYPASSD_RX_POLL, or INT32_MIN: the daemon's */
	uint32_t queue_bytes; /* BYPASSD_QUEUE_BYTES, 0: daemon default */
	struct bpd_rules rules;
	char program[64];
};
BPD_HIDDEN extern struct bpd_config bpd_cfg;

/* ---- session (session.c) ------------------------------------------------ */

struct bpd_reply {
	struct bpd_hdr h;
	uint8_t body[BPD_MSG_MAX];
	size_t body_len;
	int fds[BPD_OPEN_FDS];
	int nfds;
};

struct bpd_sock;

struct bpd_session;
/* bpd_session_get returns the process's live session, connecting (HELLO) if
 * there is none or the last one died. NULL with errno and a logged reason. */
BPD_HIDDEN struct bpd_session *bpd_session_get(void);
/* bpd_call sends msg (len bytes; its request id is assigned here) and waits
 * for the reply (5 s). Returns 0 with *r filled (the reply's status may be
 * non-zero), or an errno for a transport failure. */
BPD_HIDDEN int bpd_call(struct bpd_session *s, uint8_t *msg, size_t len, struct bpd_reply *r);
BPD_HIDDEN int bpd_session_poll_us(struct bpd_session *s);
/* Version 2: the session memory, a lane's doorbell, and the slot -> socket
 * map the monitor dispatches events through. */
BPD_HIDDEN int bpd_session_version(struct bpd_session *s);
BPD_HIDDEN struct bps *bpd_session_mem(struct bpd_session *s);
BPD_HIDDEN int bpd_session_doorbell(struct bpd_session *s, uint32_t lane);
BPD_HIDDEN void bpd_session_register(struct bpd_session *s, uint32_t slot, struct bpd_sock *sock);
BPD_HIDDEN int bpd_session_dead(struct bpd_session *s);
/* Called in a fork child: forget the parent's session without touching it. */
BPD_HIDDEN void bpd_session_forget_after_fork(void);
BPD_HIDDEN void bpd_session_atfork_prepare(void);
BPD_HIDDEN void bpd_session_atfork_parent(void);

/* ---- offloaded sockets (sock.c) ----------------------------------------- */

enum { BPD_MAX_SAVED_OPTS = 16 };

struct bpd_saved_opt {
	int level, name;
	uint32_t len;
	uint8_t val[64];
};

enum bpd_state { BPD_PENDING = 1, BPD_OFFLOADED = 2 };

struct bpd_sock {
	_Atomic int refs;    /* fd-table aliases + calls in flight */
	_Atomic int aliases; /* fd numbers naming it */
	pthread_mutex_t mu; /* state, options, control requests */
	int state;
	int family; /* AF_INET / AF_INET6 */
	int type;   /* SOCK_DGRAM (sock.c) or SOCK_STREAM (stream.c) */
	_Atomic int nonblock;
	/* Options set before the socket was offloaded, replayed at OPEN. */
	struct bpd_saved_opt saved[BPD_MAX_SAVED_OPTS];
	int nsaved;
	int reuseaddr;
	uint32_t rcvbuf, sndbuf;
	/* SO_RCVTIMEO / SO_SNDTIMEO in µs (0: none). */
	_Atomic int64_t rcvtimeo_us, sndtimeo_us;
	_Atomic uint32_t tsflags; /* SO_TIMESTAMPING */
	_Atomic int ts_ns, ts_us; /* SO_TIMESTAMPNS, SO_TIMESTAMP */

	/* Offloaded. */
	struct bpd_session *sess;
	uint32_t id;
	void *mem;
	size_t memsize;
	struct bpq tx, rx;
	int rxfd, txfd, doorbell; /* private descriptors (the app's fd aliases rxfd) */
	uint32_t max_payload;
	uint32_t slot, lane; /* version 2 */
	_Atomic int tx_waiting; /* version 2: a sender sleeps on txfd */
	struct bpd_addr laddr, raddr;
	int bound, connected;
	pthread_mutex_t txmu, rxmu;
	_Atomic int broken; /* errno every call fails with, 0: usable */
	_Atomic int closed;
	_Atomic int forked; /* inherited across fork: the parent's, unusable here */
	_Atomic int shut_rd, shut_wr;

	/* Stream sockets (stream.c). The receive side's fields are the RX
	 * lock's; the flags are atomic because senders read them. */
	_Atomic int listening, connecting;
	_Atomic int conn_err;  /* SO_ERROR: the failed handshake's or reset's errno, until read */
	_Atomic int rd_eof;    /* the peer's FIN (or a reported error) was consumed */
	_Atomic int rd_err;    /* an ERROR record consumed, not reported by a read yet */
	_Atomic int err_reported; /* the connection's failure was reported (by a read or a write) */
	uint32_t rx_off;       /* bytes of the head data record already read */
	int linger_on, linger_secs;
};

BPD_HIDDEN struct bpd_sock *bpd_sock_new(int family, int type, int nonblock);
BPD_HIDDEN void bpd_sock_ref(struct bpd_sock *s);
BPD_HIDDEN void bpd_sock_unref(struct bpd_sock *s);
/* Offload: OPEN, replay options, BIND (local, or the wildcard) and CONNECT
 * (remote, if any). 0, or an errno with nothing left at the daemon; *stage
 * says where it failed: reaching bypassd (already logged), OPEN, or BIND
 * and CONNECT (an answer about the address). */
enum { BPD_STAGE_SESSION = 0, BPD_STAGE_OPEN = 1, BPD_STAGE_ADDR = 2 };
BPD_HIDDEN int bpd_sock_offload(struct bpd_sock *s, const struct bpd_addr *local,
				const struct bpd_addr *remote, int *stage);
BPD_HIDDEN int bpd_sock_shutdown(struct bpd_sock *s, int how);
BPD_HIDDEN int bpd_sock_connect(struct bpd_sock *s, const struct bpd_addr *remote);
BPD_HIDDEN ssize_t bpd_sock_send(struct bpd_sock *s, const struct msghdr *m, int flags);
BPD_HIDDEN int bpd_sock_sendmmsg(struct bpd_sock *s, struct mmsghdr *v, unsigned n, int flags);
BPD_HIDDEN ssize_t bpd_sock_recv(struct bpd_sock *s, struct msghdr *m, int flags);
BPD_HIDDEN int bpd_sock_recvmmsg(struct bpd_sock *s, struct mmsghdr *v, unsigned n, int flags,
				 struct timespec *timeout);
BPD_HIDDEN int bpd_sock_setsockopt(struct bpd_sock *s, int level, int name, const void *val,
				   socklen_t len);
BPD_HIDDEN int bpd_sock_getsockopt(struct bpd_sock *s, int level, int name, void *val,
				   socklen_t *len);
BPD_HIDDEN int bpd_sock_fionread(struct bpd_sock *s, int *out);
/* Shared by sock.c and stream.c: the one place that knows how the queues
 * of each protocol version are attached, announced and waited on. */
BPD_HIDDEN int bpd_sock_usable(struct bpd_sock *s); /* 0 or the errno every call fails with */
BPD_HIDDEN int bpd_sock_request(struct bpd_sock *s, uint8_t *msg, size_t len, struct bpd_reply *r);
BPD_HIDDEN int bpd_sock_attach(struct bpd_sock *s, struct bpd_reply *r);
BPD_HIDDEN void bpd_sock_kick(struct bpd_sock *s);        /* publish TX, wake the daemon */
BPD_HIDDEN void bpd_sock_rx_release(struct bpd_sock *s);  /* after advancing RX */
BPD_HIDDEN void bpd_sock_rx_rearm(struct bpd_sock *s);    /* RX lock; queue found empty */
BPD_HIDDEN int bpd_sock_wait_room(struct bpd_sock *s, uint32_t n, int64_t deadline);
/* bpd_sock_rx_wait waits (RX lock held) for the RX queue after it was
 * found empty and re-armed: spins as the policy says, then sleeps. 0 to
 * look again, EAGAIN at the deadline (µs, 0: none), EINTR. */
BPD_HIDDEN int bpd_sock_rx_wait(struct bpd_sock *s, int64_t *spin_until, int64_t deadline);
BPD_HIDDEN int64_t bpd_deadline_of(_Atomic int64_t *timeo);
/* getsockopt's copy-out: at most *len bytes of data, *len set. */
BPD_HIDDEN int bpd_put_opt(void *val, socklen_t *len, const void *data, socklen_t dlen);

/* ---- stream (TCP) sockets (stream.c) ---- */
enum { BPD_REC_DATA = 2, BPD_REC_EVENT = 3, BPD_EVENT_LEN = 24 };
enum { BPD_EV_CONNECTED = 1, BPD_EV_EOF = 2, BPD_EV_ERROR = 3, BPD_EV_ACCEPTABLE = 4 };
/* Continue a connect the offload started (CONNECT sent): wait for the
 * handshake or EINPROGRESS. 0 or an errno. */
BPD_HIDDEN int bpd_stream_connected(struct bpd_sock *s);
BPD_HIDDEN int bpd_stream_connect(struct bpd_sock *s, const struct bpd_addr *remote);
BPD_HIDDEN int bpd_stream_listen(struct bpd_sock *s, int backlog);
/* Accepts one connection: a new socket (offloaded, one reference, its
 * rxfd the descriptor to give the program) in *out. 0 or an errno. */
BPD_HIDDEN int bpd_stream_accept(struct bpd_sock *s, int nonblock, struct bpd_sock **out);
BPD_HIDDEN ssize_t bpd_stream_send(struct bpd_sock *s, const struct msghdr *m, int flags);
BPD_HIDDEN ssize_t bpd_stream_recv(struct bpd_sock *s, struct msghdr *m, int flags);
BPD_HIDDEN int bpd_stream_shutdown(struct bpd_sock *s, int how);
BPD_HIDDEN int bpd_stream_fionread(struct bpd_sock *s, int *out);
/* SO_ERROR (waits for a handshake in progress), SO_ACCEPTCONN, TCP_INFO:
 * 1 when answered here (*err set). */
BPD_HIDDEN int bpd_stream_getsockopt(struct bpd_sock *s, int level, int name, void *val,
				     socklen_t *len, int *err);
/* Takes a connecting socket's outcome if it arrived (getsockname, ...). */
/* bpd_stream_events: what poll/epoll add for the stream socket beyond the
 * eventfd's readiness: EPOLLRDHUP, EPOLLHUP, EPOLLERR (their POLL*
 * values are the same bits). From flags only: never takes a lock. */
BPD_HIDDEN uint32_t bpd_stream_events(struct bpd_sock *s);
/* mux.c: forget the epoll registrations of a descriptor being closed. */
BPD_HIDDEN void bpd_mux_closed(int fd);
BPD_HIDDEN void bpd_stream_settle(struct bpd_sock *s);

/* Wakes every thread blocked on the socket (close, daemon gone). */
BPD_HIDDEN void bpd_sock_wake(struct bpd_sock *s);
BPD_HIDDEN void bpd_sock_break(struct bpd_sock *s, int err);
/* Wait (bounded) until the engine took every queued datagram. */
BPD_HIDDEN void bpd_sock_flush(struct bpd_sock *s);
/* At exit: datagrams wait to leave, connections are closed (FIN). */
BPD_HIDDEN void bpd_sock_at_exit(struct bpd_sock *s);
/* Tell the daemon (if the session lives) and release the queues. */
BPD_HIDDEN void bpd_sock_release(struct bpd_sock *s);
/* Every offloaded socket of session sess is broken with err (daemon gone). */
BPD_HIDDEN void bpd_socks_break_session(struct bpd_session *sess, int err);
BPD_HIDDEN void bpd_socks_socket_error(struct bpd_session *sess, uint32_t id, int err);

/* The fd table (intercept.c). */
BPD_HIDDEN struct bpd_sock *bpd_fd_get(int fd); /* referenced, or NULL */
BPD_HIDDEN void bpd_fd_foreach(void (*fn)(struct bpd_sock *, void *), void *arg);

/* Raw system calls the library uses itself, so that its own I/O never goes
 * through the interposed symbols. */
BPD_HIDDEN ssize_t bpd_sys_read(int fd, void *b, size_t n);
BPD_HIDDEN ssize_t bpd_sys_write(int fd, const void *b, size_t n);
BPD_HIDDEN int bpd_sys_close(int fd);
BPD_HIDDEN int bpd_eventfd_wake(int fd);
BPD_HIDDEN void bpd_eventfd_drain(int fd);
/* Waits until fd is readable or timeout_us (-1: none) passes. 1 readable,
 * 0 timeout, -1 with errno (EINTR). */
BPD_HIDDEN int bpd_wait_fd(int fd, int64_t timeout_us);
BPD_HIDDEN int64_t bpd_now_us(void);

#endif
