/* Unit test of libbypassd's pure layers (proto.c, queue.c, rules.c), built
 * with AddressSanitizer and UndefinedBehaviorSanitizer. Run by
 * socket/preload/golden_test.go with a directory of golden vectors the Go
 * implementation wrote and the protocol version it speaks; the expected
 * values here repeat that file's. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bpd.h"

static int failures;
static const char *dir;
static int version; /* the protocol version of the Go side (argv[2]) */

#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			failures++;                                                            \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                   \
			fprintf(stderr, __VA_ARGS__);                                          \
			fputc('\n', stderr);                                                   \
		}                                                                              \
	} while (0)

/* The test's own copies of what the library logs and configures. */
int bpd_log_level = BPD_LOG_ERROR;
void bpd_log(int level, const char *fmt, ...) { (void)level, (void)fmt; }

static size_t load(const char *name, uint8_t *buf, size_t cap)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	if (!f) {
		CHECK(0, "open %s: %s", path, strerror(errno));
		return 0;
	}
	size_t n = fread(buf, 1, cap, f);
	fclose(f);
	return n;
}

static void same(const char *name, const uint8_t *got, size_t n)
{
	uint8_t want[BPD_MSG_MAX];
	char file[64];
	snprintf(file, sizeof(file), "msg_%s.bin", name);
	size_t wn = load(file, want, sizeof(want));
	CHECK(wn == n && !memcmp(want, got, n), "%s: C encodes %zu bytes, Go %zu (or they differ)",
	      name, n, wn);
	if (wn == n && memcmp(want, got, n))
		for (size_t i = 0; i < n; i++)
			if (want[i] != got[i])
				fprintf(stderr, "  byte %zu: C %02x Go %02x\n", i, got[i], want[i]);
}

static struct bpd_addr v4(const char *ip, uint16_t port)
{
	struct bpd_addr a = {{0}, port};
	a.addr[10] = a.addr[11] = 0xff;
	inet_pton(AF_INET, ip, a.addr + 12);
	return a;
}

static struct bpd_addr v6(const char *ip, uint16_t port)
{
	struct bpd_addr a = {{0}, port};
	inet_pton(AF_INET6, ip, a.addr);
	return a;
}

static void test_encoders(void)
{
	uint8_t b[BPD_MSG_MAX];
	same("hello", b, bpd_enc_hello(b, 1, "golden-prog", version));
	same("open", b, bpd_enc_open(b, 7, AF_INET6, SOCK_DGRAM, 65536));
	struct bpd_addr a = v4("192.0.2.1", 5000);
	same("bind", b, bpd_enc_addrport(b, BPD_BIND, 0x01020304, 9, &a, BPD_BIND_REUSEADDR));
	a = v6("2001:db8::7", 53);
	same("connect", b, bpd_enc_addrport(b, BPD_CONNECT, 3, 4, &a, 0));
	uint32_t rate = 1000000;
	same("setsockopt", b, bpd_enc_setsockopt(b, 5, 2, 1, 47, &rate, 4));
	same("getsockopt", b, bpd_enc_getsockopt(b, 6, 2, 0, 1));
	struct bpd_addr g = v4("239.1.2.3", 0), s = v4("192.0.2.9", 0);
	same("join", b, bpd_enc_group(b, BPD_JOIN, 8, 3, g.addr, s.addr, 5));
	g = v6("ff15::1", 0);
	uint8_t none[16] = {0};
	same("leave", b, bpd_enc_group(b, BPD_LEAVE, 9, 3, g.addr, none, 0));
	same("close", b, bpd_enc_close(b, 10, 3));
	same("open_stream", b, bpd_enc_open(b, 11, AF_INET, SOCK_STREAM, 0));
	same("listen", b, bpd_enc_u32(b, BPD_LISTEN, 12, 6, 128));
	same("accept", b, bpd_enc_u32(b, BPD_ACCEPT, 13, 6, 8192));
}

static void test_decoders(void)
{
	uint8_t b[BPD_MSG_MAX];
	struct bpd_hdr h;
	size_t n = load("msg_hello_reply.bin", b, sizeof(b));
	struct bpd_hello_reply hr;
	CHECK(!bpd_dec_hdr(b, n, &h) && h.code == (BPD_HELLO | BPD_REPLY_BIT) && h.req_id == 1,
	      "hello reply header");
	CHECK(!bpd_dec_hello_reply(b + 16, n - 16, version, &hr) && hr.version == version &&
		      hr.daemon_pid == 4242 && hr.max_sockets == 1024 && hr.default_queue_bytes == 65536 &&
		      hr.rx_poll_us == -1 && (version == 1 || (hr.lanes == 2 && hr.session_size == 1 << 20)),
	      "hello reply body");
	CHECK(bpd_dec_hello_reply(b + 16, n - 16, version == 1 ? 2 : 1, &hr) == EPROTO,
	      "hello reply decoded as the other version");

	n = load("msg_open_reply.bin", b, sizeof(b));
	struct bpd_open_reply o;
	CHECK(!bpd_dec_hdr(b, n, &h) && h.socket == 5 && h.status == 0, "open reply header");
	int oe = bpd_dec_open_reply(b + 16, n - 16, version, &o);
	CHECK(!oe && o.queue_bytes == 4096 &&
		      o.tx_offset == 12288 && o.rx_offset == 20480 &&
		      (version == 1 ? o.memfd_size == 28672 : o.slot == 3 && o.lane == 1),
	      "open reply body: err %d, %zu bytes, queue %u tx %llu rx %llu memfd %llu", oe, n - 16,
	      o.queue_bytes, (unsigned long long)o.tx_offset, (unsigned long long)o.rx_offset,
	      (unsigned long long)o.memfd_size);
	/* Overlapping queues are refused. */
	uint8_t bad[32];
	memcpy(bad, b + 16, 32);
	memcpy(bad + (version == 1 ? 24 : 16), bad + (version == 1 ? 16 : 8), 8); /* rx = tx */
	CHECK(bpd_dec_open_reply(bad, 32, version, &o) == EPROTO, "overlapping queues accepted");
	memcpy(bad, b + 16, 32);
	if (version == 1)
		memset(bad + 8, 0, 8); /* a memfd of 0 bytes: the queues lie outside it */
	else
		bad[28] = 1; /* reserved */
	CHECK(bpd_dec_open_reply(bad, 32, version, &o) == EPROTO, "a bad open reply accepted");

	n = load("msg_accept_reply.bin", b, sizeof(b));
	struct bpd_addr peer, local, wp = v4("192.0.2.1", 40001), wl = v4("192.0.2.2", 80);
	CHECK(!bpd_dec_hdr(b, n, &h) && h.socket == 7 && h.code == (BPD_ACCEPT | BPD_REPLY_BIT) &&
		      !bpd_dec_accept_reply(b + 16, n - 16, version, &o, &peer, &local) &&
		      o.queue_bytes == 4096 && o.rx_offset == 20480 && !memcmp(&peer, &wp, sizeof(peer)) &&
		      !memcmp(&local, &wl, sizeof(local)),
	      "accept reply");

	n = load("msg_bind_reply.bin", b, sizeof(b));
	struct bpd_addr a, want = v6("2001:db8::7", 40000);
	CHECK(!bpd_dec_hdr(b, n, &h) && !bpd_dec_addrport(b + 16, n - 16, &a) &&
		      !memcmp(&a.addr, &want.addr, 16) && a.port == 40000,
	      "bind reply");

	n = load("msg_sockopt_val.bin", b, sizeof(b));
	uint8_t val[64];
	uint32_t vl;
	CHECK(!bpd_dec_hdr(b, n, &h) && !bpd_dec_sockopt_val(b + 16, n - 16, val, &vl) && vl == 20 &&
		      val[0] == 0xe8 && val[16] == 0x10,
	      "sockopt value");

	n = load("msg_error_reply.bin", b, sizeof(b));
	CHECK(!bpd_dec_hdr(b, n, &h) && h.status == 92 && n == 16 && h.socket == 1,
	      "error reply: status %d len %zu", h.status, n);

	n = load("msg_socket_error.bin", b, sizeof(b));
	uint32_t e;
	CHECK(!bpd_dec_hdr(b, n, &h) && h.code == BPD_SOCKET_ERROR && h.socket == 12 &&
		      !bpd_dec_u32(b + 16, n - 16, &e) && e == 100,
	      "socket error");

	/* Header rules. */
	n = load("msg_hello_reply.bin", b, sizeof(b));
	b[2] = (uint8_t)(version + 1);
	CHECK(bpd_dec_hdr(b, n, &h) == EPROTONOSUPPORT && h.version == version + 1, "another version accepted");
	CHECK(bpd_dec_hdr(b, 15, &h) == EPROTO, "short header accepted");
}

/* The golden datagrams (golden_test.go's goldenRecord). */
static const uint32_t sizes[] = {1, 100, 1000, 600, 300, 0, 133};
enum { NREC = 7 };

static void check_record(int i, const uint8_t *rec, uint32_t len, uint32_t type)
{
	CHECK(type == BPQ_TYPE_DGRAM && len == BPD_DGRAM_HDR + sizes[i], "record %d: type %u len %u",
	      i, type, len);
	if (len != BPD_DGRAM_HDR + sizes[i])
		return;
	struct bpd_addr want = v4("192.0.2.0", (uint16_t)(1000 + i));
	want.addr[15] = (uint8_t)(i + 1);
	uint16_t port = (uint16_t)(rec[16] | rec[17] << 8), fl = (uint16_t)(rec[18] | rec[19] << 8);
	int64_t ts;
	memcpy(&ts, rec + 24, 8);
	CHECK(!memcmp(rec, want.addr, 16) && port == want.port && fl == BPD_TS_SW &&
		      ts == (int64_t)i * 1000 + 7,
	      "record %d header", i);
	for (uint32_t j = 0; j < sizes[i]; j++)
		if (rec[BPD_DGRAM_HDR + j] != (uint8_t)(i * 7 + (int)j)) {
			CHECK(0, "record %d byte %u", i, j);
			break;
		}
}

static _Alignas(64) uint8_t qmem[BPQ_HEADER + 4096];

static void test_go_queue(void)
{
	size_t n = load("go_queue.bin", qmem, sizeof(qmem));
	CHECK(n == sizeof(qmem), "go queue image is %zu bytes", n);
	struct bpq q;
	CHECK(bpq_attach(&q, qmem, sizeof(qmem)) == BPQ_OK, "attach the Go queue");
	for (int i = 0; i < NREC; i++) {
		const uint8_t *rec;
		uint32_t len, type;
		int r = bpq_peek(&q, &rec, &len, &type);
		CHECK(r == BPQ_OK, "peek record %d: %d", i, r);
		if (r != BPQ_OK)
			return;
		check_record(i, rec, len, type);
		bpq_advance(&q);
	}
	const uint8_t *rec;
	uint32_t len, type;
	CHECK(bpq_peek(&q, &rec, &len, &type) == BPQ_EMPTY, "Go queue not empty after its records");
	CHECK(bpq_release(&q) == 0, "release woke a producer nobody armed");

	/* Corruption is reported, never followed: a length past the data. */
	load("go_queue.bin", qmem, sizeof(qmem));
	CHECK(bpq_attach(&q, qmem, sizeof(qmem)) == BPQ_OK, "re-attach");
	uint64_t cons;
	memcpy(&cons, qmem + 128, 8);
	uint32_t huge = 1u << 20;
	memcpy(qmem + BPQ_HEADER + (cons & 4095), &huge, 4);
	CHECK(bpq_peek(&q, &rec, &len, &type) == BPQ_CORRUPT, "oversized record accepted");
	/* A producer index that went backwards. */
	load("go_queue.bin", qmem, sizeof(qmem));
	bpq_attach(&q, qmem, sizeof(qmem));
	uint64_t prod;
	memcpy(&prod, qmem + 64, 8);
	CHECK(bpq_peek(&q, &rec, &len, &type) == BPQ_OK, "peek");
	bpq_advance(&q);
	uint64_t back = cons;
	memcpy(qmem + 64, &back, 8);
	for (int i = 0; i < NREC && bpq_peek(&q, &rec, &len, &type) == BPQ_OK; i++)
		bpq_advance(&q);
	CHECK(q.corrupt, "producer index moving backwards not detected");
	/* Bad magic. */
	load("go_queue.bin", qmem, sizeof(qmem));
	qmem[0] ^= 1;
	CHECK(bpq_attach(&q, qmem, sizeof(qmem)) == BPQ_CORRUPT, "bad magic accepted");
}

static void push(struct bpq *q, int i)
{
	uint8_t *rec;
	int r = bpq_reserve(q, BPD_DGRAM_HDR + sizes[i], &rec);
	CHECK(r == BPQ_OK, "reserve %d: %d", i, r);
	if (r != BPQ_OK)
		return;
	memset(rec, 0, BPD_DGRAM_HDR);
	struct bpd_addr a = v4("192.0.2.0", (uint16_t)(1000 + i));
	a.addr[15] = (uint8_t)(i + 1);
	memcpy(rec, a.addr, 16);
	rec[16] = (uint8_t)a.port;
	rec[17] = (uint8_t)(a.port >> 8);
	rec[18] = BPD_TS_SW;
	int64_t ts = (int64_t)i * 1000 + 7;
	memcpy(rec + 24, &ts, 8);
	for (uint32_t j = 0; j < sizes[i]; j++)
		rec[BPD_DGRAM_HDR + j] = (uint8_t)(i * 7 + (int)j);
	bpq_commit(q, BPD_DGRAM_HDR + sizes[i], BPQ_TYPE_DGRAM);
}

static void test_c_queue(void)
{
	struct bpq q;
	memset(qmem, 0xAA, sizeof(qmem));
	CHECK(bpq_init(&q, qmem, sizeof(qmem), 4096) == BPQ_OK, "init");
	/* Move the indexes as golden_test.go does, so the records wrap. */
	uint8_t *rec;
	for (int k = 0; k < 3; k++) {
		CHECK(bpq_reserve(&q, 1000, &rec) == BPQ_OK, "filler");
		memset(rec, 0, 1000);
		bpq_commit(&q, 1000, BPQ_TYPE_DGRAM);
	}
	CHECK(bpq_publish(&q) == 0, "publish woke a consumer nobody armed");
	const uint8_t *r;
	uint32_t len, type;
	for (int k = 0; k < 3; k++) {
		CHECK(bpq_peek(&q, &r, &len, &type) == BPQ_OK && len == 1000, "filler back");
		bpq_advance(&q);
	}
	bpq_release(&q);
	for (int i = 0; i < NREC; i++) {
		push(&q, i);
		/* The consumer arms (it has unread records, which arm reports);
		 * the next publish must ask for a wake-up, and only that one. */
		if (i == 4)
			CHECK(bpq_arm_read_wait(&q) == 1, "arm with records queued: reported empty");
		int woke = bpq_publish(&q);
		CHECK(woke == (i == 4), "publish %d: wake %d", i, woke);
	}
	CHECK(bpq_reserve(&q, 4000, &rec) == BPQ_TOOBIG, "a record over MaxPayload accepted");
	/* Full: the rest of the queue cannot take a 2000-byte record. */
	CHECK(bpq_reserve(&q, 2000, &rec) == BPQ_FULL, "reserve on a full queue succeeded");
	char path[512];
	snprintf(path, sizeof(path), "%s/c_queue.bin", dir);
	FILE *f = fopen(path, "wb");
	CHECK(f && fwrite(qmem, 1, sizeof(qmem), f) == sizeof(qmem), "write %s", path);
	if (f)
		fclose(f);
}

static void visit_collect(uint32_t slot, void *arg)
{
	uint64_t *mask = arg; /* slots 0..299 folded: bit slot%64 of word slot/64 */
	mask[slot / 64] |= 1ull << (slot % 64);
}

/* Session memory (protocol version 2), golden_test.go's goSessionImage. */
static void test_session(void)
{
	struct bps_layout l;
	CHECK(!bps_layout(300, 2, 4 * 4096, &l) && l.words == 5 && l.mids == 1 && l.bitmap_size == 192 &&
		      l.lanes_offset == 8192 && l.lane_stride == 256 && l.arena_offset == 12288 &&
		      l.size == 28672,
	      "layout of 300 slots, 2 lanes");
	/* The worked example of docs/shm-queue.md. */
	CHECK(!bps_layout(16384, 2, 1ull << 30, &l) && l.bitmap_size == 2176 && l.lanes_offset == 8192 &&
		      l.lane_stride == 2240 && l.arena_offset == 16384 && l.size == 1073758208,
	      "the documented example");
	CHECK(bps_layout(0, 1, 4096, &l) && bps_layout(1, 65, 4096, &l) && bps_layout(1, 1, 100, &l),
	      "bad layouts accepted");

	uint8_t *mem = aligned_alloc(4096, 28672);
	size_t n = load("go_session.bin", mem, 28672);
	CHECK(n == 28672, "go session image is %zu bytes", n);
	struct bps s;
	CHECK(bps_attach(&s, mem, 28672, 301, 2) == -1, "attach with the wrong slot count");
	CHECK(bps_attach(&s, mem, 28672, 300, 1) == -1, "attach with the wrong lane count");
	CHECK(bps_attach(&s, mem, 24576, 300, 2) == -1, "attach with the wrong size");
	CHECK(bps_attach(&s, mem, 28672, 300, 2) == 0, "attach the Go session memory");
	uint64_t mask[5] = {0};
	CHECK(bps_drain(&s.events, visit_collect, mask) == 4 && mask[0] == (1ull | 1ull << 63) &&
		      mask[1] == 1 && mask[4] == 1ull << (299 % 64),
	      "events drained: %llx %llx %llx", (unsigned long long)mask[0],
	      (unsigned long long)mask[1], (unsigned long long)mask[4]);
	CHECK(bps_drain(&s.events, visit_collect, mask) == 0, "events drained twice");
	CHECK(bps_announce(&s, 1, 7) == 1, "lane 1's engine sleeps: no doorbell asked");
	CHECK(bps_announce(&s, 1, 8) == 0, "a second doorbell for one sleep");
	CHECK(bps_announce(&s, 0, 299) == 0, "a doorbell for a running engine");
	CHECK(bps_announce(&s, 2, 1) == 0 && bps_announce(&s, 0, 300) == 0, "out of range announced");
	CHECK(bps_arm_client_sleep(&s) == 0, "pending events after the drain");
	CHECK(bps_queue_ok(&s, 12288, 4096) && !bps_queue_ok(&s, 8192, 4096) &&
		      !bps_queue_ok(&s, 28672 - 4096, 4096) && !bps_queue_ok(&s, 12289, 4096),
	      "queue placement checks");
	char path[512];
	snprintf(path, sizeof(path), "%s/c_session.bin", dir);
	FILE *f = fopen(path, "wb");
	CHECK(f && fwrite(mem, 1, 28672, f) == 28672, "write %s", path);
	if (f)
		fclose(f);
	/* A hostile peer's bits beyond the slots are ignored, never followed. */
	atomic_store(s.events.summary, ~0ull);
	atomic_store(&s.events.mid[0], ~0ull);
	memset(mask, 0, sizeof(mask));
	CHECK(bps_drain(&s.events, visit_collect, mask) == 0, "bits without leaves visited");
	free(mem);
}

static void test_rules(void)
{
	struct bpd_rules rs;
	char err[256];
	CHECK(!bpd_rules_parse(&rs, NULL, err, sizeof(err)) && rs.n == 0 && rs.dflt == BPD_RULE_OFFLOAD,
	      "no rules");
	bpd_rules_free(&rs);
	const char *text = "kernel remote=10.0.0.0/8 # management\n"
			   "offload program=sock* local=*:11111-11112\n"
			   "kernel local=[2001:db8::]/32:*; offload local=192.0.2.1\n"
			   "default kernel\n";
	CHECK(!bpd_rules_parse(&rs, text, err, sizeof(err)) && rs.n == 4 && rs.dflt == BPD_RULE_KERNEL,
	      "parse: %s", err);
	struct bpd_addr r1 = v4("10.1.2.3", 53), l1 = v4("192.0.2.7", 11111), l2 = v6("2001:db8::5", 9),
			l3 = v4("192.0.2.1", 4000), l4 = v4("192.0.2.2", 4000);
	CHECK(bpd_rules_match(&rs, "x", NULL, &r1) == BPD_RULE_KERNEL, "remote prefix");
	CHECK(bpd_rules_match(&rs, "sockperf", &l1, NULL) == BPD_RULE_OFFLOAD, "program and port");
	CHECK(bpd_rules_match(&rs, "other", &l1, NULL) == BPD_RULE_KERNEL, "program mismatch");
	CHECK(bpd_rules_match(&rs, "x", &l2, NULL) == BPD_RULE_KERNEL, "v6 prefix");
	CHECK(bpd_rules_match(&rs, "x", &l3, NULL) == BPD_RULE_OFFLOAD, "exact address");
	CHECK(bpd_rules_match(&rs, "x", &l4, NULL) == BPD_RULE_KERNEL, "default");
	bpd_rules_free(&rs);
	const char *bad[] = {"offload local=300.1.1.1", "maybe", "offload local=*/8", "default",
			     "kernel local=1.2.3.4:70000", "offload remote=1.2.3.4:9-8", "offload x=y"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		CHECK(bpd_rules_parse(&rs, bad[i], err, sizeof(err)) == -1 && err[0],
		      "bad rule \"%s\" accepted", bad[i]);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s GOLDEN_DIR PROTOCOL_VERSION\n", argv[0]);
		return 2;
	}
	dir = argv[1];
	version = atoi(argv[2]);
	atomic_store(&bpd_proto_version, version);
	test_encoders();
	test_decoders();
	test_go_queue();
	test_c_queue();
	test_session();
	test_rules();
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ok (encoders, decoders, queues and session memory both ways, rules)\n");
	return 0;
}
