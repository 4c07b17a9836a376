/* The session memory of control protocol version 2 (docs/shm-queue.md,
 * "Session memory"; the Go implementation is internal/shmsess): the layout
 * check a client makes before trusting the memfd, the three-level bitmaps
 * (set bottom up, drain top down, all read-modify-writes seq_cst) and the
 * sleep flags of both sides. The header fields are read once and must equal
 * what the HELLO reply and the layout formulas say; a drain reads at most
 * 1 + M + W words and visits at most S slots, whatever the peer wrote. */
#include <string.h>

#include "bpd.h"

enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 4,
	OFF_SIZE = 8,
	OFF_HSIZE = 16,
	OFF_SLOTS = 20,
	OFF_LANES = 24,
	OFF_EVENTS = 32,
	OFF_LANES_OFF = 40,
	OFF_STRIDE = 48,
	OFF_ARENA = 56,
	OFF_ARENA_SIZE = 64,
	OFF_CLIENT_SLEEPING = 128,
};

static uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static uint32_t rd32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

int bps_layout(uint32_t slots, uint32_t lanes, uint64_t arena, struct bps_layout *l)
{
	if (slots < 1 || slots > BPS_MAX_SLOTS || lanes < 1 || lanes > BPS_MAX_LANES ||
	    arena < BPS_PAGE || arena > (1ull << 46) || arena % BPS_PAGE)
		return -1;
	l->words = (slots + 63) / 64;
	l->mids = (l->words + 63) / 64;
	l->bitmap_size = 64 + align_up(8ull * l->mids, 64) + align_up(8ull * l->words, 64);
	l->events_offset = BPS_HEADER;
	l->lanes_offset = align_up(l->events_offset + l->bitmap_size, BPS_PAGE);
	l->lane_stride = align_up(64 + l->bitmap_size, 64);
	l->arena_offset = align_up(l->lanes_offset + lanes * l->lane_stride, BPS_PAGE);
	l->arena_size = arena;
	l->size = l->arena_offset + arena;
	return 0;
}

static void bitmap_at(struct bps_bitmap *b, uint8_t *mem, uint64_t off, const struct bps_layout *l,
		      uint32_t slots)
{
	b->summary = (_Atomic uint64_t *)(void *)(mem + off);
	b->mid = (_Atomic uint64_t *)(void *)(mem + off + 64);
	b->leaf = (_Atomic uint64_t *)(void *)(mem + off + 64 + align_up(8ull * l->mids, 64));
	b->mids = l->mids;
	b->words = l->words;
	b->slots = slots;
}

int bps_attach(struct bps *s, void *mem, uint64_t size, uint32_t slots, uint32_t lanes)
{
	uint8_t *m = mem;
	memset(s, 0, sizeof(*s));
	if (size < BPS_HEADER || ((uintptr_t)m & 4095))
		return -1;
	if (atomic_load_explicit((_Atomic uint32_t *)(void *)(m + OFF_MAGIC), memory_order_acquire) !=
		    BPS_MAGIC ||
	    rd32(m + OFF_VERSION) != 2 || rd32(m + OFF_HSIZE) != BPS_HEADER ||
	    rd32(m + OFF_SLOTS) != slots || rd32(m + OFF_LANES) != lanes)
		return -1;
	struct bps_layout l;
	if (bps_layout(slots, lanes, rd64(m + OFF_ARENA_SIZE), &l))
		return -1;
	if (rd64(m + OFF_SIZE) != l.size || rd64(m + OFF_EVENTS) != l.events_offset ||
	    rd64(m + OFF_LANES_OFF) != l.lanes_offset || rd64(m + OFF_STRIDE) != l.lane_stride ||
	    rd64(m + OFF_ARENA) != l.arena_offset || size != l.size)
		return -1;
	s->mem = m;
	s->l = l;
	s->slots = slots;
	s->lanes = lanes;
	s->client_sleeping = (_Atomic uint32_t *)(void *)(m + OFF_CLIENT_SLEEPING);
	bitmap_at(&s->events, m, l.events_offset, &l, slots);
	for (uint32_t i = 0; i < lanes; i++) {
		uint64_t off = l.lanes_offset + i * l.lane_stride;
		s->lane[i].engine_sleeping = (_Atomic uint32_t *)(void *)(m + off);
		bitmap_at(&s->lane[i].announce, m, off + 64, &l, slots);
	}
	return 0;
}

void bps_set(struct bps_bitmap *b, uint32_t slot)
{
	if (slot >= b->slots)
		return;
	uint32_t w = slot / 64, mi = w / 64;
	uint64_t lb = 1ull << (slot % 64), mb = 1ull << (w % 64);
	/* Bottom up; a bit already set needs no write (the line stays shared). */
	if (!(atomic_load(&b->leaf[w]) & lb))
		atomic_fetch_or(&b->leaf[w], lb);
	if (!(atomic_load(&b->mid[mi]) & mb))
		atomic_fetch_or(&b->mid[mi], mb);
	atomic_fetch_or(b->summary, 1ull << mi); /* (E) */
}

int bps_pending(struct bps_bitmap *b) { return atomic_load(b->summary) != 0; }

int bps_drain(struct bps_bitmap *b, void (*visit)(uint32_t slot, void *arg), void *arg)
{
	if (!atomic_load(b->summary))
		return 0;
	uint64_t s = atomic_exchange(b->summary, 0);
	int n = 0;
	while (s) {
		uint32_t mi = (uint32_t)__builtin_ctzll(s);
		s &= s - 1;
		if (mi >= b->mids)
			continue;
		uint64_t x = atomic_exchange(&b->mid[mi], 0);
		while (x) {
			uint32_t w = 64 * mi + (uint32_t)__builtin_ctzll(x);
			x &= x - 1;
			if (w >= b->words)
				continue;
			uint64_t y = atomic_exchange(&b->leaf[w], 0);
			while (y) {
				uint32_t slot = 64 * w + (uint32_t)__builtin_ctzll(y);
				y &= y - 1;
				if (slot < b->slots) {
					visit(slot, arg);
					n++;
				}
			}
		}
	}
	return n;
}

int bps_announce(struct bps *s, uint32_t lane, uint32_t slot)
{
	if (lane >= s->lanes)
		return 0;
	bps_set(&s->lane[lane].announce, slot);
	_Atomic uint32_t *sl = s->lane[lane].engine_sleeping;
	return atomic_load(sl) && atomic_exchange(sl, 0); /* (F) */
}

int bps_arm_client_sleep(struct bps *s)
{
	atomic_exchange(s->client_sleeping, 1);
	return bps_pending(&s->events);
}

void bps_disarm_client_sleep(struct bps *s)
{
	if (atomic_load(s->client_sleeping))
		atomic_store(s->client_sleeping, 0);
}

int bps_queue_ok(const struct bps *s, uint64_t off, uint32_t queue_bytes)
{
	uint64_t span = BPQ_HEADER + (uint64_t)queue_bytes;
	return off % 8 == 0 && off >= s->l.arena_offset && off <= s->l.size && s->l.size - off >= span;
}
