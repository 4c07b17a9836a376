/* The shared-memory single-producer/single-consumer queue of
 * docs/shm-queue.md, in C11 atomics. The peer (bypassd) may be buggy or
 * hostile: capacity is read once, every index loaded from the peer and
 * every record header is validated before use, and a violation marks the
 * queue corrupt (the caller then breaks the socket) instead of touching
 * memory outside it. The Dekker pairs (publish/arm) are seq_cst as the doc
 * requires; the other index accesses are acquire/release. */
#include <string.h>

#include "bpd.h"

enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 4,
	OFF_CAP = 8,
	OFF_HSIZE = 16,
	OFF_PROD = 64,
	OFF_DROPPED = 72,
	OFF_CONS = 128,
	OFF_CONS_ERR = 136,
	OFF_CONS_WAITING = 192,
	OFF_PROD_WAITING = 196,
};

static uint64_t align8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static uint32_t rd32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4); /* little-endian host (x86-64, arm64 LE) */
	return v;
}

static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static int valid_cap(uint64_t c) { return c >= 4096 && c <= (1u << 30) && (c & (c - 1)) == 0; }

static void setup(struct bpq *q, uint8_t *m, uint64_t cap, uint64_t prod, uint64_t cons)
{
	memset(q, 0, sizeof(*q));
	q->data = m + BPQ_HEADER;
	q->prod = (_Atomic uint64_t *)(void *)(m + OFF_PROD);
	q->cons = (_Atomic uint64_t *)(void *)(m + OFF_CONS);
	q->dropped = (_Atomic uint64_t *)(void *)(m + OFF_DROPPED);
	q->cons_err = (_Atomic uint32_t *)(void *)(m + OFF_CONS_ERR);
	q->cons_waiting = (_Atomic uint32_t *)(void *)(m + OFF_CONS_WAITING);
	q->prod_waiting = (_Atomic uint32_t *)(void *)(m + OFF_PROD_WAITING);
	q->cap = cap;
	q->mask = cap - 1;
	q->max_payload = (uint32_t)(cap / 2 - BPQ_RECHDR);
	q->p_idx = q->p_pub = prod;
	q->p_cons = cons;
	q->c_idx = q->c_rel = cons;
	q->c_prod = prod;
}

int bpq_init(struct bpq *q, void *mem, uint64_t memlen, uint64_t cap)
{
	uint8_t *m = mem;
	if (((uintptr_t)m & 7) || !valid_cap(cap) || memlen < BPQ_HEADER + cap)
		return BPQ_CORRUPT;
	memset(m, 0, BPQ_HEADER);
	wr32(m + OFF_VERSION, BPQ_VERSION);
	memcpy(m + OFF_CAP, &cap, 8);
	wr32(m + OFF_HSIZE, BPQ_HEADER);
	atomic_store_explicit((_Atomic uint32_t *)(void *)(m + OFF_MAGIC), BPQ_MAGIC,
			      memory_order_release);
	setup(q, m, cap, 0, 0);
	return BPQ_OK;
}

int bpq_attach(struct bpq *q, void *mem, uint64_t memlen)
{
	uint8_t *m = mem;
	if (((uintptr_t)m & 7) || memlen < BPQ_HEADER)
		return BPQ_CORRUPT;
	if (atomic_load_explicit((_Atomic uint32_t *)(void *)(m + OFF_MAGIC), memory_order_acquire) !=
	    BPQ_MAGIC)
		return BPQ_CORRUPT;
	uint64_t cap;
	memcpy(&cap, m + OFF_CAP, 8);
	if (rd32(m + OFF_VERSION) != BPQ_VERSION || rd32(m + OFF_HSIZE) != BPQ_HEADER ||
	    !valid_cap(cap) || memlen < BPQ_HEADER + cap)
		return BPQ_CORRUPT;
	uint64_t cons = atomic_load_explicit((_Atomic uint64_t *)(void *)(m + OFF_CONS),
					     memory_order_acquire);
	uint64_t prod = atomic_load_explicit((_Atomic uint64_t *)(void *)(m + OFF_PROD),
					     memory_order_acquire);
	if (prod % 8 || cons % 8 || prod - cons > cap)
		return BPQ_CORRUPT;
	setup(q, m, cap, prod, cons);
	return BPQ_OK;
}

/* ---- producer ---- */

static int refresh_cons(struct bpq *q)
{
	uint64_t c = atomic_load_explicit(q->cons, memory_order_acquire);
	/* Never backwards, never past what was published. */
	if (c % 8 || c - q->p_cons > q->p_pub - q->p_cons) {
		q->corrupt = 1;
		return 0;
	}
	q->p_cons = c;
	return 1;
}

static uint64_t need_for(const struct bpq *q, uint64_t total, uint64_t *pad)
{
	uint64_t off = q->p_idx & q->mask;
	*pad = off + total > q->cap ? q->cap - off : 0;
	return *pad + total;
}

int bpq_reserve(struct bpq *q, uint32_t n, uint8_t **out)
{
	if (q->corrupt)
		return BPQ_CORRUPT;
	if (n > q->max_payload)
		return BPQ_TOOBIG;
	uint64_t total = BPQ_RECHDR + align8(n), pad;
	uint64_t need = need_for(q, total, &pad);
	if (need > q->cap - (q->p_idx - q->p_cons)) {
		if (!refresh_cons(q))
			return BPQ_CORRUPT;
		if (need > q->cap - (q->p_idx - q->p_cons))
			return BPQ_FULL;
	}
	uint64_t off = q->p_idx & q->mask;
	if (pad) {
		wr32(q->data + off, (uint32_t)(pad - BPQ_RECHDR));
		wr32(q->data + off + 4, BPQ_TYPE_PAD);
		q->p_idx += pad;
		off = 0;
	}
	q->res_off = off;
	*out = q->data + off + BPQ_RECHDR;
	return BPQ_OK;
}

void bpq_commit(struct bpq *q, uint32_t n, uint32_t type)
{
	wr32(q->data + q->res_off, n);
	wr32(q->data + q->res_off + 4, type);
	q->p_idx += BPQ_RECHDR + align8(n);
}

int bpq_publish(struct bpq *q)
{
	if (q->p_idx == q->p_pub)
		return 0;
	atomic_store_explicit(q->prod, q->p_idx, memory_order_seq_cst); /* (A) */
	q->p_pub = q->p_idx;
	if (atomic_load_explicit(q->cons_waiting, memory_order_seq_cst)) /* (B) */
		return atomic_exchange_explicit(q->cons_waiting, 0, memory_order_seq_cst) != 0;
	return 0;
}

static int writable(struct bpq *q, uint32_t n)
{
	if (q->corrupt || n > q->max_payload)
		return 1; /* the caller's next reserve reports it */
	uint64_t pad, need = need_for(q, BPQ_RECHDR + align8(n), &pad);
	if (need <= q->cap - (q->p_idx - q->p_cons))
		return 1;
	if (!refresh_cons(q))
		return 1;
	return need <= q->cap - (q->p_idx - q->p_cons);
}

int bpq_arm_write_wait(struct bpq *q, uint32_t n)
{
	atomic_store_explicit(q->prod_waiting, 1, memory_order_seq_cst);
	return writable(q, n);
}

void bpq_disarm_write_wait(struct bpq *q)
{
	atomic_store_explicit(q->prod_waiting, 0, memory_order_seq_cst);
}

/* ---- consumer ---- */

static int refresh_prod(struct bpq *q)
{
	uint64_t p = atomic_load_explicit(q->prod, memory_order_acquire);
	uint64_t d = p - q->c_idx;
	if (p % 8 || d > q->cap || d < q->c_prod - q->c_idx) {
		q->corrupt = 1;
		return 0;
	}
	q->c_prod = p;
	return 1;
}

static int corrupt(struct bpq *q)
{
	q->corrupt = 1;
	return BPQ_CORRUPT;
}

int bpq_peek(struct bpq *q, const uint8_t **rec, uint32_t *len, uint32_t *type)
{
	if (q->peek_total) {
		*rec = q->data + q->peek_off + BPQ_RECHDR;
		*len = q->peek_len;
		*type = q->peek_type;
		return BPQ_OK;
	}
	if (q->corrupt)
		return BPQ_CORRUPT;
	for (int i = 0; i < 2; i++) {
		uint64_t avail = q->c_prod - q->c_idx;
		if (avail == 0) {
			if (!refresh_prod(q))
				return BPQ_CORRUPT;
			if ((avail = q->c_prod - q->c_idx) == 0)
				return BPQ_EMPTY;
		}
		uint64_t off = q->c_idx & q->mask;
		if (avail < BPQ_RECHDR)
			return corrupt(q);
		/* Read the header once; the peer may change it under us. */
		uint32_t n = rd32(q->data + off), t = rd32(q->data + off + 4);
		if (t == BPQ_TYPE_PAD) {
			uint64_t span = q->cap - off;
			if (off == 0 || (uint64_t)n != span - BPQ_RECHDR || span > avail)
				return corrupt(q);
			q->c_idx += span;
			continue;
		}
		if (n > q->max_payload)
			return corrupt(q);
		uint64_t total = BPQ_RECHDR + align8(n);
		if (off + total > q->cap || total > avail)
			return corrupt(q);
		q->peek_total = total;
		q->peek_off = off;
		q->peek_len = n;
		q->peek_type = t;
		*rec = q->data + off + BPQ_RECHDR;
		*len = n;
		*type = t;
		return BPQ_OK;
	}
	return corrupt(q); /* two paddings in a row */
}

void bpq_advance(struct bpq *q)
{
	q->c_idx += q->peek_total;
	q->peek_total = 0;
}

int bpq_release(struct bpq *q)
{
	if (q->c_idx == q->c_rel)
		return 0;
	atomic_store_explicit(q->cons, q->c_idx, memory_order_seq_cst);
	q->c_rel = q->c_idx;
	if (atomic_load_explicit(q->prod_waiting, memory_order_seq_cst))
		return atomic_exchange_explicit(q->prod_waiting, 0, memory_order_seq_cst) != 0;
	return 0;
}

int bpq_readable(struct bpq *q)
{
	if (q->peek_total || q->corrupt || q->c_prod != q->c_idx)
		return 1;
	if (!refresh_prod(q))
		return 1;
	return q->c_prod != q->c_idx;
}

int bpq_arm_read_wait(struct bpq *q)
{
	atomic_store_explicit(q->cons_waiting, 1, memory_order_seq_cst); /* (C) */
	if (q->peek_total || q->corrupt)
		return 1;
	uint64_t p = atomic_load_explicit(q->prod, memory_order_seq_cst); /* (D) */
	if (p != q->c_idx) {
		if (!refresh_prod(q))
			return 1;
		return q->c_prod != q->c_idx;
	}
	return 0;
}

int bpq_disarm_read_wait(struct bpq *q)
{
	return (int)atomic_exchange_explicit(q->cons_waiting, 0, memory_order_seq_cst);
}
