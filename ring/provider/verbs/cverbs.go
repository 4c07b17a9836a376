//go:build verbs

package verbs

// The whole cgo surface of the provider is this preamble: thin C helpers that
// call libibverbs and copy results into flat structs. Everything that decides
// something (sizes, masks, the QP state walk, flow rules, rate checks, error
// meaning) is Go in the other files, where tests can reach it without a
// device. Each helper returns 0 or an errno value; none keeps a pointer to Go
// memory beyond the call.
//
// Why helpers at all rather than calling libibverbs from Go directly: most of
// the data-path verbs (ibv_post_send, ibv_start_poll, ibv_alloc_dm,
// ibv_create_flow's attribute layout, ...) are static inline functions or
// need variable-length C structs, which cgo cannot call or build.

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// bpd_caps: the facts of ibv_device_attr_ex and ibv_port_attr Go parses.
struct bpd_caps {
	char fw_ver[64];
	uint64_t node_guid;
	uint32_t vendor_id, vendor_part_id, hw_ver;
	int32_t max_qp, max_qp_wr, max_cqe;
	uint8_t phys_port_cnt;
	uint64_t device_cap_flags;
	uint64_t completion_timestamp_mask;
	uint64_t hca_core_clock;
	uint32_t pp_min, pp_max, pp_qpts;
	uint32_t raw_packet_caps;
	uint64_t max_dm_size;
	uint32_t tso_max, tso_qpts;
	uint8_t port_state, link_layer, active_mtu;
	uint32_t port_ok;
};

static int bpd_device_names(char *buf, int len, int *count) {
	int n = 0;
	errno = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return errno ? errno : ENODEV;
	int off = 0;
	buf[0] = 0;
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		int l = strlen(name);
		if (off + l + 2 > len)
			break;
		memcpy(buf + off, name, l);
		off += l;
		buf[off++] = '\n';
		buf[off] = 0;
	}
	*count = n;
	ibv_free_device_list(list);
	return 0;
}

static int bpd_open(const char *name, struct ibv_context **out) {
	int n = 0;
	errno = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return errno ? errno : ENODEV;
	int err = ENODEV;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) != 0)
			continue;
		errno = 0;
		*out = ibv_open_device(list[i]);
		err = *out ? 0 : (errno ? errno : EIO);
		break;
	}
	ibv_free_device_list(list);
	if (err == 0) {
		// Completion and async events are polled with the engine's other
		// descriptors; blocking reads would stall its thread.
		int fl = fcntl((*out)->async_fd, F_GETFL);
		if (fl < 0 || fcntl((*out)->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
			err = errno;
			ibv_close_device(*out);
			*out = NULL;
		}
	}
	return err;
}

static int bpd_query(struct ibv_context *ctx, uint8_t port, struct bpd_caps *c) {
	struct ibv_device_attr_ex a;
	memset(&a, 0, sizeof(a));
	memset(c, 0, sizeof(*c));
	int err = ibv_query_device_ex(ctx, NULL, &a);
	if (err)
		return err;
	memcpy(c->fw_ver, a.orig_attr.fw_ver, sizeof(c->fw_ver));
	c->fw_ver[sizeof(c->fw_ver) - 1] = 0;
	c->node_guid = a.orig_attr.node_guid;
	c->vendor_id = a.orig_attr.vendor_id;
	c->vendor_part_id = a.orig_attr.vendor_part_id;
	c->hw_ver = a.orig_attr.hw_ver;
	c->max_qp = a.orig_attr.max_qp;
	c->max_qp_wr = a.orig_attr.max_qp_wr;
	c->max_cqe = a.orig_attr.max_cqe;
	c->phys_port_cnt = a.orig_attr.phys_port_cnt;
	c->device_cap_flags = (uint64_t)a.orig_attr.device_cap_flags | a.device_cap_flags_ex;
	c->completion_timestamp_mask = a.completion_timestamp_mask;
	c->hca_core_clock = a.hca_core_clock;
	c->pp_min = a.packet_pacing_caps.qp_rate_limit_min;
	c->pp_max = a.packet_pacing_caps.qp_rate_limit_max;
	c->pp_qpts = a.packet_pacing_caps.supported_qpts;
	c->raw_packet_caps = a.raw_packet_caps;
	c->max_dm_size = a.max_dm_size;
	c->tso_max = a.tso_caps.max_tso;
	c->tso_qpts = a.tso_caps.supported_qpts;
	if (port) {
		struct ibv_port_attr p;
		memset(&p, 0, sizeof(p));
		if (ibv_query_port(ctx, port, &p) == 0) {
			c->port_ok = 1;
			c->port_state = p.state;
			c->link_layer = p.link_layer;
			c->active_mtu = p.active_mtu;
		}
	}
	return 0;
}

static int bpd_sample_clock(struct ibv_context *ctx, int64_t *before, uint64_t *hw, int64_t *after) {
	struct ibv_values_ex v;
	struct timespec t0, t1;
	memset(&v, 0, sizeof(v));
	v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
	clock_gettime(CLOCK_REALTIME, &t0);
	int err = ibv_query_rt_values_ex(ctx, &v);
	clock_gettime(CLOCK_REALTIME, &t1);
	if (err)
		return err;
	if (!(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK))
		return EOPNOTSUPP;
	*before = (int64_t)t0.tv_sec * 1000000000 + t0.tv_nsec;
	*after = (int64_t)t1.tv_sec * 1000000000 + t1.tv_nsec;
	// Providers put the raw tick count in the timespec (mlx5: all of it in
	// tv_nsec); folding it the same way as the readers of this verb do keeps
	// both layouts right.
	*hw = (uint64_t)v.raw_clock.tv_sec * 1000000000ULL + (uint64_t)v.raw_clock.tv_nsec;
	return 0;
}

static int bpd_create_channel(struct ibv_context *ctx, struct ibv_comp_channel **out) {
	errno = 0;
	*out = ibv_create_comp_channel(ctx);
	if (!*out)
		return errno ? errno : ENOMEM;
	int fl = fcntl((*out)->fd, F_GETFL);
	if (fl < 0 || fcntl((*out)->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		int err = errno;
		ibv_destroy_comp_channel(*out);
		*out = NULL;
		return err;
	}
	return 0;
}

static int bpd_create_cq(struct ibv_context *ctx, struct ibv_comp_channel *ch, uint32_t cqe,
		uint64_t wc_flags, struct ibv_cq_ex **out) {
	struct ibv_cq_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.cqe = cqe;
	a.channel = ch;
	a.wc_flags = wc_flags;
	errno = 0;
	*out = ibv_create_cq_ex(ctx, &a);
	return *out ? 0 : (errno ? errno : ENOMEM);
}

static int bpd_destroy_cq(struct ibv_cq_ex *cq) {
	return ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

static int bpd_arm_cq(struct ibv_cq_ex *cq) {
	return ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0);
}

// bpd_drain_events reads and acknowledges every pending completion event of
// the channel; it returns how many, or -errno.
static int bpd_drain_events(struct ibv_comp_channel *ch) {
	int n = 0;
	for (;;) {
		struct ibv_cq *cq;
		void *cqctx;
		if (ibv_get_cq_event(ch, &cq, &cqctx) != 0)
			return (errno == EAGAIN || errno == EWOULDBLOCK) ? n : -errno;
		ibv_ack_cq_events(cq, 1);
		n++;
	}
}

// bpd_async_event reads one pending async event (the type, or -1 when none).
static int bpd_async_event(struct ibv_context *ctx, int *type) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev) != 0) {
		*type = -1;
		return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : errno;
	}
	*type = ev.event_type;
	ibv_ack_async_event(&ev);
	return 0;
}

struct bpd_qp_init {
	uint32_t sq, rq, sge, inline_data, tso_header;
};

// bpd_create_qp creates a raw packet QP; with tso_header, one that takes
// large sends (IBV_WR_TSO) whose headers are up to that many bytes, which
// only the extended call can ask for (the send queue's entries are sized
// for the headers copied into them).
static int bpd_create_qp(struct ibv_pd *pd, struct ibv_cq_ex *scq, struct ibv_cq_ex *rcq,
		struct bpd_qp_init *in, struct ibv_qp **out) {
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.send_cq = ibv_cq_ex_to_cq(scq);
	a.recv_cq = ibv_cq_ex_to_cq(rcq);
	a.cap.max_send_wr = in->sq;
	a.cap.max_recv_wr = in->rq;
	a.cap.max_send_sge = in->sge;
	a.cap.max_recv_sge = in->rq ? in->sge : 0;
	a.cap.max_inline_data = in->inline_data;
	a.qp_type = IBV_QPT_RAW_PACKET;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd;
	if (in->tso_header) {
		a.comp_mask |= IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
		a.max_tso_header = in->tso_header;
	}
	errno = 0;
	*out = ibv_create_qp_ex(pd->context, &a);
	if (!*out)
		return errno ? errno : ENOMEM;
	// The device may grant more inline space than asked; report it.
	in->inline_data = a.cap.max_inline_data;
	return 0;
}

static int bpd_modify_qp(struct ibv_qp *qp, int state, int mask, uint8_t port) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	a.port_num = port;
	return ibv_modify_qp(qp, &a, mask);
}

static int bpd_rate_limit(struct ibv_qp *qp, uint32_t kbps, uint32_t burst, uint16_t typical) {
	struct ibv_qp_rate_limit_attr a;
	memset(&a, 0, sizeof(a));
	a.rate_limit = kbps;
	a.max_burst_sz = burst;
	a.typical_pkt_sz = typical;
	return ibv_modify_qp_rate_limit(qp, &a);
}

static int bpd_reg_mr(struct ibv_pd *pd, void *addr, size_t len, struct ibv_mr **out) {
	errno = 0;
	*out = ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
	return *out ? 0 : (errno ? errno : ENOMEM);
}

#define BPD_CHAIN 32

// bpd_post_recv posts n receive buffers of len bytes at base+offs[i] (the
// registered pool), wr_id = offset. *posted says how many were accepted.
static int bpd_post_recv(struct ibv_qp *qp, uint32_t lkey, uint64_t base, const uint64_t *offs,
		uint32_t len, int n, int *posted) {
	struct ibv_recv_wr wr[BPD_CHAIN], *bad;
	struct ibv_sge sge[BPD_CHAIN];
	*posted = 0;
	while (*posted < n) {
		int k = n - *posted < BPD_CHAIN ? n - *posted : BPD_CHAIN;
		for (int i = 0; i < k; i++) {
			uint64_t off = offs[*posted + i];
			sge[i].addr = base + off;
			sge[i].length = len;
			sge[i].lkey = lkey;
			wr[i].wr_id = off;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		int err = ibv_post_recv(qp, wr, &bad);
		if (err) {
			*posted += (int)(bad - wr);
			return err;
		}
		*posted += k;
	}
	return 0;
}

// bpd_send is one send work request as Go prepared it; mss > 0 makes it a
// large send whose first hdr_sz bytes are the headers.
struct bpd_send {
	uint64_t addr;
	uint64_t wr_id;
	uint32_t len;
	uint32_t lkey;
	uint32_t flags;
	uint16_t mss, hdr_sz;
};

// bpd_fill_send builds the work request of x. A large send (IBV_WR_TSO)
// names its headers by address (the provider copies them into the send
// queue entry during ibv_post_send, so the buffer's own copy serves) and
// gathers the payload after them; the device cuts the payload into mss-byte
// segments behind a copy of the headers.
static void bpd_fill_send(struct ibv_send_wr *wr, struct ibv_sge *sge, const struct bpd_send *x) {
	memset(wr, 0, sizeof(*wr));
	sge->addr = x->addr;
	sge->length = x->len;
	sge->lkey = x->lkey;
	wr->wr_id = x->wr_id;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = IBV_WR_SEND;
	wr->send_flags = x->flags;
	if (x->mss) {
		wr->opcode = IBV_WR_TSO;
		wr->tso.hdr = (void *)(uintptr_t)x->addr;
		wr->tso.hdr_sz = x->hdr_sz;
		wr->tso.mss = x->mss;
		sge->addr = x->addr + x->hdr_sz;
		sge->length = x->len - x->hdr_sz;
	}
}

// bpd_send_view is what bpd_fill_send put in the verbs.h structs, read
// back by field name, for the Go tests.
struct bpd_send_view {
	uint64_t wr_id, sge_addr, tso_hdr;
	uint32_t opcode, send_flags, sge_len, sge_lkey;
	int32_t num_sge;
	uint16_t tso_hdr_sz, tso_mss;
};

static void bpd_view_send(const struct bpd_send *x, struct bpd_send_view *v) {
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	bpd_fill_send(&wr, &sge, x);
	v->wr_id = wr.wr_id;
	v->opcode = wr.opcode;
	v->send_flags = wr.send_flags;
	v->num_sge = wr.num_sge;
	v->sge_addr = wr.sg_list->addr;
	v->sge_len = wr.sg_list->length;
	v->sge_lkey = wr.sg_list->lkey;
	v->tso_hdr = (uint64_t)(uintptr_t)wr.tso.hdr;
	v->tso_hdr_sz = wr.tso.hdr_sz;
	v->tso_mss = wr.tso.mss;
}

static int bpd_post_send(struct ibv_qp *qp, const struct bpd_send *s, int n, int *posted) {
	struct ibv_send_wr wr[BPD_CHAIN], *bad;
	struct ibv_sge sge[BPD_CHAIN];
	*posted = 0;
	while (*posted < n) {
		int k = n - *posted < BPD_CHAIN ? n - *posted : BPD_CHAIN;
		for (int i = 0; i < k; i++) {
			bpd_fill_send(&wr[i], &sge[i], &s[*posted + i]);
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		int err = ibv_post_send(qp, wr, &bad);
		if (err) {
			*posted += (int)(bad - wr);
			return err;
		}
		*posted += k;
	}
	return 0;
}

// bpd_wc is one completion as Go reads it.
struct bpd_wc {
	uint64_t wr_id;
	uint64_t ts;
	uint32_t status;
	uint32_t len;
};

// bpd_poll reads up to max completions; ts says whether the CQ was created
// with completion timestamps. Returns the count or -errno.
static int bpd_poll(struct ibv_cq_ex *cq, struct bpd_wc *out, int max, int ts) {
	struct ibv_poll_cq_attr attr;
	memset(&attr, 0, sizeof(attr));
	int err = ibv_start_poll(cq, &attr);
	if (err == ENOENT)
		return 0;
	if (err)
		return -err;
	int n = 0;
	for (;;) {
		out[n].wr_id = cq->wr_id;
		out[n].status = cq->status;
		out[n].len = cq->status == IBV_WC_SUCCESS ? ibv_wc_read_byte_len(cq) : 0;
		out[n].ts = (ts && cq->status == IBV_WC_SUCCESS) ? ibv_wc_read_completion_ts(cq) : 0;
		n++;
		if (n == max)
			break;
		err = ibv_next_poll(cq);
		if (err == ENOENT)
			break;
		if (err) {
			ibv_end_poll(cq);
			return -err;
		}
	}
	ibv_end_poll(cq);
	return n;
}

static int bpd_create_flow(struct ibv_qp *qp, const void *attr, struct ibv_flow **out) {
	errno = 0;
	*out = ibv_create_flow(qp, (struct ibv_flow_attr *)attr);
	return *out ? 0 : (errno ? errno : EINVAL);
}

static int bpd_alloc_dm(struct ibv_context *ctx, struct ibv_pd *pd, size_t len,
		struct ibv_dm **dm, struct ibv_mr **mr) {
	struct ibv_alloc_dm_attr a;
	memset(&a, 0, sizeof(a));
	a.length = len;
	errno = 0;
	*dm = ibv_alloc_dm(ctx, &a);
	if (!*dm)
		return errno ? errno : ENOMEM;
	errno = 0;
	*mr = ibv_reg_dm_mr(pd, *dm, 0, len, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
	if (!*mr) {
		int err = errno ? errno : ENOMEM;
		ibv_free_dm(*dm);
		*dm = NULL;
		return err;
	}
	return 0;
}

static int bpd_memcpy_to_dm(struct ibv_dm *dm, uint64_t off, const void *src, size_t len) {
	return ibv_memcpy_to_dm(dm, off, src, len);
}

static int bpd_free_dm(struct ibv_dm *dm) {
	return ibv_free_dm(dm);
}

static int bpd_dereg_mr(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }
static uint32_t bpd_mr_lkey(struct ibv_mr *mr) { return mr->lkey; }
static int bpd_channel_fd(struct ibv_comp_channel *ch) { return ch->fd; }
static int bpd_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }

// Layout facts the Go side relies on (checked in Go at compile time).
enum {
	bpd_off_eth_val = offsetof(struct ibv_flow_spec_eth, val),
	bpd_off_eth_mask = offsetof(struct ibv_flow_spec_eth, mask),
	bpd_off_eth_type = offsetof(struct ibv_flow_eth_filter, ether_type),
	bpd_off_ipv4_val = offsetof(struct ibv_flow_spec_ipv4, val),
	bpd_off_ipv4_mask = offsetof(struct ibv_flow_spec_ipv4, mask),
	bpd_off_ipv6_val = offsetof(struct ibv_flow_spec_ipv6, val),
	bpd_off_ipv6_mask = offsetof(struct ibv_flow_spec_ipv6, mask),
	bpd_off_udp_val = offsetof(struct ibv_flow_spec_tcp_udp, val),
	bpd_off_udp_mask = offsetof(struct ibv_flow_spec_tcp_udp, mask),
	bpd_off_attr_size = offsetof(struct ibv_flow_attr, size),
	bpd_off_attr_priority = offsetof(struct ibv_flow_attr, priority),
	bpd_off_attr_specs = offsetof(struct ibv_flow_attr, num_of_specs),
	bpd_off_attr_port = offsetof(struct ibv_flow_attr, port),
	bpd_off_attr_flags = offsetof(struct ibv_flow_attr, flags),
};

// The tso member as rdma-core lays it out (checked by the Go tests).
enum {
	bpd_off_wr_tso_hdr = offsetof(struct ibv_send_wr, tso.hdr),
	bpd_off_wr_tso_hdr_sz = offsetof(struct ibv_send_wr, tso.hdr_sz),
	bpd_off_wr_tso_mss = offsetof(struct ibv_send_wr, tso.mss),
	bpd_size_wr = sizeof(struct ibv_send_wr),
};
*/
import "C"

import (
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Compile-time checks that the Go mirrors match verbs.h: each pair of
// conversions to uint overflows (a build error) unless the two are equal.
const (
	_ = uint(C.sizeof_struct_ibv_flow_attr-flowAttrSize) + uint(flowAttrSize-C.sizeof_struct_ibv_flow_attr)
	_ = uint(C.sizeof_struct_ibv_flow_spec_eth-flowSpecEthSize) + uint(flowSpecEthSize-C.sizeof_struct_ibv_flow_spec_eth)
	_ = uint(C.sizeof_struct_ibv_flow_spec_ipv4-flowSpecIPv4Size) + uint(flowSpecIPv4Size-C.sizeof_struct_ibv_flow_spec_ipv4)
	_ = uint(C.sizeof_struct_ibv_flow_spec_ipv6-flowSpecIPv6Size) + uint(flowSpecIPv6Size-C.sizeof_struct_ibv_flow_spec_ipv6)
	_ = uint(C.sizeof_struct_ibv_flow_spec_tcp_udp-flowSpecUDPSize) + uint(flowSpecUDPSize-C.sizeof_struct_ibv_flow_spec_tcp_udp)
	_ = uint(C.bpd_off_eth_val-6) + uint(6-C.bpd_off_eth_val)
	_ = uint(C.bpd_off_eth_mask-22) + uint(22-C.bpd_off_eth_mask)
	_ = uint(C.bpd_off_eth_type-12) + uint(12-C.bpd_off_eth_type)
	_ = uint(C.bpd_off_ipv4_val-8) + uint(8-C.bpd_off_ipv4_val)
	_ = uint(C.bpd_off_ipv4_mask-16) + uint(16-C.bpd_off_ipv4_mask)
	_ = uint(C.bpd_off_ipv6_val-8) + uint(8-C.bpd_off_ipv6_val)
	_ = uint(C.bpd_off_ipv6_mask-48) + uint(48-C.bpd_off_ipv6_mask)
	_ = uint(C.bpd_off_udp_val-6) + uint(6-C.bpd_off_udp_val)
	_ = uint(C.bpd_off_udp_mask-10) + uint(10-C.bpd_off_udp_mask)
	_ = uint(C.bpd_off_attr_size-8) + uint(8-C.bpd_off_attr_size)
	_ = uint(C.bpd_off_attr_priority-10) + uint(10-C.bpd_off_attr_priority)
	_ = uint(C.bpd_off_attr_specs-12) + uint(12-C.bpd_off_attr_specs)
	_ = uint(C.bpd_off_attr_port-13) + uint(13-C.bpd_off_attr_port)
	_ = uint(C.bpd_off_attr_flags-16) + uint(16-C.bpd_off_attr_flags)

	_ = uint(C.sizeof_struct_bpd_wc-unsafe.Sizeof(completion{})) + uint(unsafe.Sizeof(completion{})-C.sizeof_struct_bpd_wc)
	_ = uint(C.sizeof_struct_bpd_send-unsafe.Sizeof(sendWR{})) + uint(unsafe.Sizeof(sendWR{})-C.sizeof_struct_bpd_send)

	_ = uint(C.IBV_QPS_INIT-qpsInit) + uint(qpsInit-C.IBV_QPS_INIT)
	_ = uint(C.IBV_QPS_RTR-qpsRTR) + uint(qpsRTR-C.IBV_QPS_RTR)
	_ = uint(C.IBV_QPS_RTS-qpsRTS) + uint(qpsRTS-C.IBV_QPS_RTS)
	_ = uint(C.IBV_QPS_RESET-qpsReset) + uint(qpsReset-C.IBV_QPS_RESET)
	_ = uint(C.IBV_QP_STATE-qpAttrState) + uint(qpAttrState-C.IBV_QP_STATE)
	_ = uint(C.IBV_QP_PORT-qpAttrPort) + uint(qpAttrPort-C.IBV_QP_PORT)
	_ = uint(C.IBV_QPT_RAW_PACKET-qptRawPacket) + uint(qptRawPacket-C.IBV_QPT_RAW_PACKET)
	_ = uint(C.IBV_SEND_SIGNALED-sendSignaled) + uint(sendSignaled-C.IBV_SEND_SIGNALED)
	_ = uint(C.IBV_SEND_INLINE-sendInline) + uint(sendInline-C.IBV_SEND_INLINE)
	_ = uint(C.IBV_SEND_IP_CSUM-sendIPCsum) + uint(sendIPCsum-C.IBV_SEND_IP_CSUM)
	_ = uint(C.IBV_WR_SEND-wrSend) + uint(wrSend-C.IBV_WR_SEND)
	_ = uint(C.IBV_WR_TSO-wrTSO) + uint(wrTSO-C.IBV_WR_TSO)
	_ = uint(C.IBV_WC_SUCCESS-wcSuccess) + uint(wcSuccess-C.IBV_WC_SUCCESS)
	_ = uint(C.IBV_WC_WR_FLUSH_ERR-wcFlushError) + uint(wcFlushError-C.IBV_WC_WR_FLUSH_ERR)
	_ = uint(C.IBV_WC_EX_WITH_BYTE_LEN-wcExWithByteLen) + uint(wcExWithByteLen-C.IBV_WC_EX_WITH_BYTE_LEN)
	_ = uint(C.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP-wcExWithCompletionTimestamp) + uint(wcExWithCompletionTimestamp-C.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
	_ = uint(C.IBV_FLOW_ATTR_NORMAL-flowAttrNormal) + uint(flowAttrNormal-C.IBV_FLOW_ATTR_NORMAL)
	_ = uint(C.IBV_FLOW_SPEC_ETH-flowSpecEth) + uint(flowSpecEth-C.IBV_FLOW_SPEC_ETH)
	_ = uint(C.IBV_FLOW_SPEC_IPV4-flowSpecIPv4) + uint(flowSpecIPv4-C.IBV_FLOW_SPEC_IPV4)
	_ = uint(C.IBV_FLOW_SPEC_IPV6-flowSpecIPv6) + uint(flowSpecIPv6-C.IBV_FLOW_SPEC_IPV6)
	_ = uint(C.IBV_FLOW_SPEC_UDP-flowSpecUDP) + uint(flowSpecUDP-C.IBV_FLOW_SPEC_UDP)
	_ = uint(C.IBV_LINK_LAYER_ETHERNET-linkLayerEthernet) + uint(linkLayerEthernet-C.IBV_LINK_LAYER_ETHERNET)
	_ = uint(C.IBV_LINK_LAYER_INFINIBAND-linkLayerInfiniband) + uint(linkLayerInfiniband-C.IBV_LINK_LAYER_INFINIBAND)
	_ = uint(C.IBV_PORT_ACTIVE-portActive) + uint(portActive-C.IBV_PORT_ACTIVE)
	_ = uint(C.IBV_RAW_PACKET_CAP_CVLAN_STRIPPING-rawCapCVLANStripping) + uint(rawCapCVLANStripping-C.IBV_RAW_PACKET_CAP_CVLAN_STRIPPING)
	_ = uint(C.IBV_RAW_PACKET_CAP_SCATTER_FCS-rawCapScatterFCS) + uint(rawCapScatterFCS-C.IBV_RAW_PACKET_CAP_SCATTER_FCS)
	_ = uint(C.IBV_RAW_PACKET_CAP_IP_CSUM-rawCapIPCsum) + uint(rawCapIPCsum-C.IBV_RAW_PACKET_CAP_IP_CSUM)
	_ = uint(C.IBV_RAW_PACKET_CAP_DELAY_DROP-rawCapDelayDrop) + uint(rawCapDelayDrop-C.IBV_RAW_PACKET_CAP_DELAY_DROP)
	_ = uint(C.IBV_EVENT_QP_FATAL-eventQPFatal) + uint(eventQPFatal-C.IBV_EVENT_QP_FATAL)
	_ = uint(C.IBV_EVENT_CQ_ERR-eventCQError) + uint(eventCQError-C.IBV_EVENT_CQ_ERR)
	_ = uint(C.IBV_EVENT_DEVICE_FATAL-eventDeviceFatal) + uint(eventDeviceFatal-C.IBV_EVENT_DEVICE_FATAL)
)

// Handles of libibverbs objects. Only this file dereferences them.
type (
	cContext = *C.struct_ibv_context
	cPD      = *C.struct_ibv_pd
	cChannel = *C.struct_ibv_comp_channel
	cCQ      = *C.struct_ibv_cq_ex
	cQP      = *C.struct_ibv_qp
	cMR      = *C.struct_ibv_mr
	cFlow    = *C.struct_ibv_flow
	cDM      = *C.struct_ibv_dm
)

func cDeviceNames() ([]string, error) {
	buf := make([]byte, 4096)
	var n C.int
	if rc := C.bpd_device_names((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)), &n); rc != 0 {
		return nil, errnoOf(int(rc))
	}
	s := C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	return strings.Fields(s), nil
}

func cOpen(name string) (cContext, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var ctx cContext
	if rc := C.bpd_open(cs, &ctx); rc != 0 {
		return nil, errnoOf(int(rc))
	}
	return ctx, nil
}

func cClose(ctx cContext) error { return errnoOf(int(C.ibv_close_device(ctx))) }

func cQuery(ctx cContext, port uint8) (rawCaps, error) {
	var c C.struct_bpd_caps
	if rc := C.bpd_query(ctx, C.uint8_t(port), &c); rc != 0 {
		return rawCaps{}, errnoOf(int(rc))
	}
	return rawCaps{
		FWVer:        C.GoString(&c.fw_ver[0]),
		NodeGUID:     uint64(c.node_guid),
		VendorID:     uint32(c.vendor_id),
		VendorPartID: uint32(c.vendor_part_id),
		HWVer:        uint32(c.hw_ver),
		MaxQP:        int32(c.max_qp),
		MaxQPWR:      int32(c.max_qp_wr),
		MaxCQE:       int32(c.max_cqe),
		PhysPortCnt:  uint8(c.phys_port_cnt),
		CapFlags:     uint64(c.device_cap_flags),
		TSMask:       uint64(c.completion_timestamp_mask),
		CoreClockKHz: uint64(c.hca_core_clock),
		PPMin:        uint32(c.pp_min),
		PPMax:        uint32(c.pp_max),
		PPQPTypes:    uint32(c.pp_qpts),
		RawPacketCap: uint32(c.raw_packet_caps),
		MaxDMSize:    uint64(c.max_dm_size),
		TSOMax:       uint32(c.tso_max),
		TSOQPTypes:   uint32(c.tso_qpts),
		PortQueried:  c.port_ok != 0,
		PortState:    uint8(c.port_state),
		LinkLayer:    uint8(c.link_layer),
		ActiveMTU:    uint8(c.active_mtu),
	}, nil
}

func cSampleClock(ctx cContext) (before int64, hw uint64, after int64, err error) {
	var b, a C.int64_t
	var h C.uint64_t
	if rc := C.bpd_sample_clock(ctx, &b, &h, &a); rc != 0 {
		return 0, 0, 0, errnoOf(int(rc))
	}
	return int64(b), uint64(h), int64(a), nil
}

func cAllocPD(ctx cContext) (cPD, error) {
	pd, err := C.ibv_alloc_pd(ctx)
	if pd == nil {
		if err == nil {
			err = unix.ENOMEM
		}
		return nil, err
	}
	return pd, nil
}

func cDeallocPD(pd cPD) error { return errnoOf(int(C.ibv_dealloc_pd(pd))) }

func cCreateChannel(ctx cContext) (cChannel, error) {
	var ch cChannel
	if rc := C.bpd_create_channel(ctx, &ch); rc != 0 {
		return nil, errnoOf(int(rc))
	}
	return ch, nil
}

func cDestroyChannel(ch cChannel) error { return errnoOf(int(C.ibv_destroy_comp_channel(ch))) }
func cChannelFD(ch cChannel) int        { return int(C.bpd_channel_fd(ch)) }
func cAsyncFD(ctx cContext) int         { return int(C.bpd_async_fd(ctx)) }

func cCreateCQ(ctx cContext, ch cChannel, cqe int, wcFlags uint64) (cCQ, error) {
	var cq cCQ
	if rc := C.bpd_create_cq(ctx, ch, C.uint32_t(cqe), C.uint64_t(wcFlags), &cq); rc != 0 {
		return nil, errnoOf(int(rc))
	}
	return cq, nil
}

func cDestroyCQ(cq cCQ) error { return errnoOf(int(C.bpd_destroy_cq(cq))) }
func cArmCQ(cq cCQ) error     { return errnoOf(int(C.bpd_arm_cq(cq))) }

func cDrainEvents(ch cChannel) (int, error) {
	n := int(C.bpd_drain_events(ch))
	if n < 0 {
		return 0, errnoOf(n)
	}
	return n, nil
}

// cAsyncEvent returns the next async event type, -1 when none is pending.
func cAsyncEvent(ctx cContext) (int, error) {
	var t C.int
	if rc := C.bpd_async_event(ctx, &t); rc != 0 {
		return -1, errnoOf(int(rc))
	}
	return int(t), nil
}

// cCreateQP creates a raw packet QP (tsoHeader > 0: one that takes large
// sends with headers up to that size); it returns the inline size granted.
func cCreateQP(pd cPD, scq, rcq cCQ, sq, rq, inline, tsoHeader int) (cQP, int, error) {
	in := C.struct_bpd_qp_init{sq: C.uint32_t(sq), rq: C.uint32_t(rq), sge: 1, inline_data: C.uint32_t(inline),
		tso_header: C.uint32_t(tsoHeader)}
	var q cQP
	if rc := C.bpd_create_qp(pd, scq, rcq, &in, &q); rc != 0 {
		return nil, 0, errnoOf(int(rc))
	}
	return q, int(in.inline_data), nil
}

func cDestroyQP(q cQP) error { return errnoOf(int(C.ibv_destroy_qp(q))) }

func cModifyQP(q cQP, st qpStep) error {
	return errnoOf(int(C.bpd_modify_qp(q, C.int(st.State), C.int(st.Mask), C.uint8_t(st.Port))))
}

func cRateLimit(q cQP, kbps, burst uint32, typical uint16) error {
	return errnoOf(int(C.bpd_rate_limit(q, C.uint32_t(kbps), C.uint32_t(burst), C.uint16_t(typical))))
}

// cRegMR registers mem (memory outside the Go heap) for local access.
func cRegMR(pd cPD, mem []byte) (cMR, uint32, error) {
	var mr cMR
	if rc := C.bpd_reg_mr(pd, unsafe.Pointer(&mem[0]), C.size_t(len(mem)), &mr); rc != 0 {
		return nil, 0, errnoOf(int(rc))
	}
	return mr, uint32(C.bpd_mr_lkey(mr)), nil
}

func cDeregMR(mr cMR) error { return errnoOf(int(C.bpd_dereg_mr(mr))) }

func cPostRecv(q cQP, lkey uint32, base uintptr, offs []uint64, size int) (int, error) {
	if len(offs) == 0 {
		return 0, nil
	}
	var posted C.int
	rc := C.bpd_post_recv(q, C.uint32_t(lkey), C.uint64_t(base), (*C.uint64_t)(unsafe.Pointer(&offs[0])),
		C.uint32_t(size), C.int(len(offs)), &posted)
	return int(posted), errnoOf(int(rc))
}

func cPostSend(q cQP, wrs []sendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	var posted C.int
	rc := C.bpd_post_send(q, (*C.struct_bpd_send)(unsafe.Pointer(&wrs[0])), C.int(len(wrs)), &posted)
	return int(posted), errnoOf(int(rc))
}

// sendView is a work request as bpd_fill_send builds it for ibv_post_send,
// read back from rdma-core's structs by field name.
type sendView struct {
	WRID, SGEAddr, TSOHdr      uint64
	Opcode, Flags, SGELen, Key uint32
	NumSGE                     int32
	TSOHdrSize, TSOMSS         uint16
}

// cViewSend builds w's work request with the code ibv_post_send gets and
// reads it back (the unit tests' view of what the device would be given).
func cViewSend(w sendWR) sendView {
	var v C.struct_bpd_send_view
	C.bpd_view_send((*C.struct_bpd_send)(unsafe.Pointer(&w)), &v)
	return sendView{WRID: uint64(v.wr_id), SGEAddr: uint64(v.sge_addr), TSOHdr: uint64(v.tso_hdr),
		Opcode: uint32(v.opcode), Flags: uint32(v.send_flags), SGELen: uint32(v.sge_len), Key: uint32(v.sge_lkey),
		NumSGE: int32(v.num_sge), TSOHdrSize: uint16(v.tso_hdr_sz), TSOMSS: uint16(v.tso_mss)}
}

// sendWRLayout is where verbs.h puts the tso member of struct ibv_send_wr,
// and the struct's size.
func sendWRLayout() (hdr, hdrSize, mss, size uintptr) {
	return C.bpd_off_wr_tso_hdr, C.bpd_off_wr_tso_hdr_sz, C.bpd_off_wr_tso_mss, C.bpd_size_wr
}

func cPoll(cq cCQ, out []completion, ts bool) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	t := C.int(0)
	if ts {
		t = 1
	}
	n := int(C.bpd_poll(cq, (*C.struct_bpd_wc)(unsafe.Pointer(&out[0])), C.int(len(out)), t))
	if n < 0 {
		return 0, errnoOf(n)
	}
	return n, nil
}

func cCreateFlow(q cQP, attr []byte) (cFlow, error) {
	var f cFlow
	if rc := C.bpd_create_flow(q, unsafe.Pointer(&attr[0]), &f); rc != 0 {
		return nil, errnoOf(int(rc))
	}
	return f, nil
}

func cDestroyFlow(f cFlow) error { return errnoOf(int(C.ibv_destroy_flow(f))) }

func cAllocDM(ctx cContext, pd cPD, size int) (cDM, cMR, uint32, error) {
	var dm cDM
	var mr cMR
	if rc := C.bpd_alloc_dm(ctx, pd, C.size_t(size), &dm, &mr); rc != 0 {
		return nil, nil, 0, errnoOf(int(rc))
	}
	return dm, mr, uint32(C.bpd_mr_lkey(mr)), nil
}

func cMemcpyToDM(dm cDM, off int, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return errnoOf(int(C.bpd_memcpy_to_dm(dm, C.uint64_t(off), unsafe.Pointer(&b[0]), C.size_t(len(b)))))
}

func cFreeDM(dm cDM) error { return errnoOf(int(C.bpd_free_dm(dm))) }
