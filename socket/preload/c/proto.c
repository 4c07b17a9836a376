/* Control protocol messages (docs/protocol.md): little-endian, fixed
 * layouts. Encoders write every byte (reserved fields zero); decoders check
 * lengths and reserved fields as the Go codec (internal/ctlproto) does, and
 * the golden test (socket/preload/golden_test.go) holds the two to the same
 * bytes. */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "bpd.h"

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

_Atomic int bpd_proto_version = BPD_PROTO_MAX;

static size_t hdr_v(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock, size_t body, int version)
{
	memset(buf, 0, BPD_HDR_LEN + body);
	put16(buf, code);
	put16(buf + 2, (uint16_t)version);
	put32(buf + 4, req);
	put32(buf + 12, sock);
	return BPD_HDR_LEN + body;
}

static size_t hdr(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock, size_t body)
{
	return hdr_v(buf, code, req, sock, body, atomic_load(&bpd_proto_version));
}

/* bpd_enc_hello offers exactly version: a version 2 daemon answers a
 * version 1 header with a refusal, and a version 1 daemon a version 2 one,
 * so the client offers one version per connection (session.c). */
size_t bpd_enc_hello(uint8_t *buf, uint32_t req, const char *name, int version)
{
	size_t n = hdr_v(buf, BPD_HELLO, req, 0, 40, version);
	uint8_t *b = buf + BPD_HDR_LEN;
	put16(b, (uint16_t)version);
	put16(b + 2, (uint16_t)version);
	size_t l = strnlen(name, 32);
	if (l == 32)
		l = 31; /* keep a NUL: the daemon wants NUL padding after the name */
	memcpy(b + 8, name, l);
	return n;
}

size_t bpd_enc_open(uint8_t *buf, uint32_t req, uint16_t family, int type, uint32_t queue_bytes)
{
	size_t n = hdr(buf, BPD_OPEN, req, 0, 8);
	uint8_t *b = buf + BPD_HDR_LEN;
	put16(b, family == AF_INET6 ? 10 : 2);
	put16(b + 2, type == SOCK_STREAM ? 1 : 2);
	put32(b + 4, queue_bytes);
	return n;
}

/* LISTEN (24) and ACCEPT (25) bodies are one u32: the backlog, the new
 * socket's queue size. */
size_t bpd_enc_u32(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock, uint32_t v)
{
	size_t n = hdr(buf, code, req, sock, 4);
	put32(buf + BPD_HDR_LEN, v);
	return n;
}

size_t bpd_enc_addrport(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock,
			const struct bpd_addr *a, uint16_t flags)
{
	size_t n = hdr(buf, code, req, sock, 20);
	uint8_t *b = buf + BPD_HDR_LEN;
	memcpy(b, a->addr, 16);
	put16(b + 16, a->port);
	put16(b + 18, flags);
	return n;
}

size_t bpd_enc_setsockopt(uint8_t *buf, uint32_t req, uint32_t sock, int32_t level, int32_t name,
			  const void *val, uint32_t len)
{
	size_t n = hdr(buf, BPD_SETSOCKOPT, req, sock, 76);
	uint8_t *b = buf + BPD_HDR_LEN;
	if (len > 64)
		len = 64; /* callers check; never write past the field */
	put32(b, (uint32_t)level);
	put32(b + 4, (uint32_t)name);
	put32(b + 8, len);
	if (len)
		memcpy(b + 12, val, len);
	return n;
}

size_t bpd_enc_getsockopt(uint8_t *buf, uint32_t req, uint32_t sock, int32_t level, int32_t name)
{
	size_t n = hdr(buf, BPD_GETSOCKOPT, req, sock, 8);
	put32(buf + BPD_HDR_LEN, (uint32_t)level);
	put32(buf + BPD_HDR_LEN + 4, (uint32_t)name);
	return n;
}

size_t bpd_enc_group(uint8_t *buf, uint16_t code, uint32_t req, uint32_t sock,
		     const uint8_t group[16], const uint8_t source[16], uint32_t ifindex)
{
	size_t n = hdr(buf, code, req, sock, 36);
	uint8_t *b = buf + BPD_HDR_LEN;
	memcpy(b, group, 16);
	memcpy(b + 16, source, 16);
	put32(b + 32, ifindex);
	return n;
}

size_t bpd_enc_close(uint8_t *buf, uint32_t req, uint32_t sock)
{
	return hdr(buf, BPD_CLOSE, req, sock, 0);
}

int bpd_dec_hdr(const uint8_t *buf, size_t len, struct bpd_hdr *h)
{
	if (len < BPD_HDR_LEN || len > BPD_MSG_MAX)
		return EPROTO;
	h->code = get16(buf);
	h->version = get16(buf + 2);
	h->req_id = get32(buf + 4);
	h->status = (int32_t)get32(buf + 8);
	h->socket = get32(buf + 12);
	if (h->version != atomic_load(&bpd_proto_version))
		return EPROTONOSUPPORT;
	if (h->status < 0 || h->status > 4095)
		return EPROTO;
	if (!(h->code & BPD_REPLY_BIT) && h->status != 0)
		return EPROTO;
	return 0;
}

static int zero(const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

int bpd_dec_hello_reply(const uint8_t *b, size_t len, int version, struct bpd_hello_reply *r)
{
	memset(r, 0, sizeof(*r));
	if (len != (version == 1 ? 20u : 32u))
		return EPROTO;
	r->version = get16(b);
	r->lanes = get16(b + 2);
	r->daemon_pid = get32(b + 4);
	r->max_sockets = get32(b + 8);
	r->default_queue_bytes = get32(b + 12);
	r->rx_poll_us = (int32_t)get32(b + 16);
	if (r->version != version || r->rx_poll_us < -1)
		return EPROTO;
	if (version == 1)
		return r->lanes ? EPROTO : 0; /* reserved in version 1 */
	r->session_size = get64(b + 24);
	if (get32(b + 20) || r->lanes > 64 || r->max_sockets > BPS_MAX_SLOTS ||
	    (r->lanes == 0) != (r->session_size == 0))
		return EPROTO;
	return 0;
}

static int valid_queue_bytes(uint32_t q)
{
	return q >= BPD_MIN_QUEUE && q <= BPD_MAX_QUEUE && (q & (q - 1)) == 0;
}

int bpd_dec_open_reply(const uint8_t *b, size_t len, int version, struct bpd_open_reply *r)
{
	memset(r, 0, sizeof(*r));
	if (len != 32)
		return EPROTO;
	r->queue_bytes = get32(b);
	if (version == 1) {
		if (get32(b + 4))
			return EPROTO;
		r->memfd_size = get64(b + 8);
		r->tx_offset = get64(b + 16);
		r->rx_offset = get64(b + 24);
	} else {
		r->slot = get32(b + 4);
		r->tx_offset = get64(b + 8);
		r->rx_offset = get64(b + 16);
		r->lane = get16(b + 24);
		if (get16(b + 26) || get32(b + 28) || r->slot >= BPS_MAX_SLOTS || r->lane >= 64)
			return EPROTO;
		/* The session memory bounds the offsets (sock.c checks them
		 * against its arena). */
		r->memfd_size = UINT64_MAX;
	}
	if (!valid_queue_bytes(r->queue_bytes))
		return EPROTO;
	uint64_t qs = BPQ_HEADER + (uint64_t)r->queue_bytes;
	uint64_t t = r->tx_offset, x = r->rx_offset, m = r->memfd_size;
	if (t % 8 || x % 8 || t > m || m - t < qs || x > m || m - x < qs)
		return EPROTO;
	if (t < x + qs && x < t + qs) /* overlap */
		return EPROTO;
	return 0;
}

int bpd_dec_accept_reply(const uint8_t *b, size_t len, int version, struct bpd_open_reply *o,
			 struct bpd_addr *peer, struct bpd_addr *local)
{
	if (len != 72)
		return EPROTO;
	int err = bpd_dec_open_reply(b, 32, version, o);
	if (!err)
		err = bpd_dec_addrport(b + 32, 20, peer);
	if (!err)
		err = bpd_dec_addrport(b + 52, 20, local);
	return err;
}

int bpd_dec_addrport(const uint8_t *b, size_t len, struct bpd_addr *a)
{
	if (len != 20 || get16(b + 18) != 0)
		return EPROTO;
	memcpy(a->addr, b, 16);
	a->port = get16(b + 16);
	return 0;
}

int bpd_dec_sockopt_val(const uint8_t *b, size_t len, uint8_t val[64], uint32_t *vlen)
{
	if (len != 68)
		return EPROTO;
	uint32_t l = get32(b);
	if (l > 64 || !zero(b + 4 + l, 64 - l))
		return EPROTO;
	memcpy(val, b + 4, 64);
	*vlen = l;
	return 0;
}

int bpd_dec_u32(const uint8_t *b, size_t len, uint32_t *v)
{
	if (len != 4)
		return EPROTO;
	*v = get32(b);
	return 0;
}

static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

int bpd_addr_from_sockaddr(const struct sockaddr *sa, socklen_t len, int family, struct bpd_addr *a)
{
	memset(a, 0, sizeof(*a));
	if (!sa || len < (socklen_t)sizeof(sa_family_t))
		return EINVAL;
	if (sa->sa_family == AF_INET) {
		if (len < (socklen_t)sizeof(struct sockaddr_in))
			return EINVAL;
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		if (family != AF_INET)
			return EAFNOSUPPORT; /* a v4 address on a v6 socket: the kernel path */
		memcpy(a->addr, v4mapped, 12);
		memcpy(a->addr + 12, &in->sin_addr, 4);
		a->port = ntohs(in->sin_port);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		if (len < (socklen_t)sizeof(struct sockaddr_in6))
			return EINVAL;
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		if (family != AF_INET6)
			return EAFNOSUPPORT;
		if (in6->sin6_scope_id)
			return EINVAL; /* zones are not supported by bypassd */
		memcpy(a->addr, &in6->sin6_addr, 16);
		a->port = ntohs(in6->sin6_port);
		return 0;
	}
	return EAFNOSUPPORT;
}

socklen_t bpd_addr_to_sockaddr(const struct bpd_addr *a, int family, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	int mapped = memcmp(a->addr, v4mapped, 12) == 0;
	if (family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(a->port);
		if (mapped)
			memcpy(&in->sin_addr, a->addr + 12, 4);
		return sizeof(*in);
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons(a->port);
	memcpy(&in6->sin6_addr, a->addr, 16);
	return sizeof(*in6);
}

int bpd_addr_is_zero(const struct bpd_addr *a) { return a->port == 0 && zero(a->addr, 16); }
