// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * steer.c: bypassd's XDP steering program.
 *
 * For every frame received on the interface it decides between two
 * outcomes only: redirect into the AF_XDP socket that owns the flow, or
 * XDP_PASS to the kernel stack. It never drops: anything it does not
 * understand (ARP, ICMP, ND, truncated headers, unknown ports, fragmented
 * TCP) goes to the kernel unchanged, so attaching it cannot break the
 * host's normal networking. UDP and TCP are steered by the same flow map
 * (the key's proto tells them apart): a TCP listener's 3-tuple entry takes
 * every segment to its port (SYNs and its connections), a connecting
 * socket's 5-tuple entry the segments of that one connection.
 *
 * Two entry points share the code: steer, and steer_ts, the device-bound
 * variant the loader uses when hardware receive timestamps are wanted and
 * the attach is native (device-bound programs cannot run in generic mode).
 * steer_ts asks the driver for the frame's receive timestamp
 * (bpf_xdp_metadata_rx_timestamp) and writes a struct rx_meta in front of
 * every frame it redirects, where the AF_XDP reader finds it. Both write
 * the flow's tag (struct flow_meta) in front of that.
 *
 * A flow's frames go to the AF_XDP socket of the queue that received them
 * (ctx->rx_queue_index): the kernel drops frames redirected to a socket of
 * another queue. The ring of that queue hands them to the flow's home ring.
 *
 * VXLAN overlays: a UDP datagram to one of the ports in vxlan_ports (a
 * VXLAN device's dstport that an overlay socket uses) is looked into: its
 * inner frame is parsed like an outer one and looked up with the VNI in the
 * key, so an overlay socket's frames are steered by (VNI, inner tuple) and
 * everything else in the tunnel (ARP, other VNIs, unbound ports) goes to the
 * kernel's vxlan device as before.
 *
 * Layouts of flow_key, flow_val, frag_key, vxlan_ports and the counter indexes are
 * mirrored in Go (bpf/flow.go) and checked against this object's BTF;
 * rx_meta and flow_meta are mirrored in bpf/rxmeta.go and checked against what the loaded
 * program writes.
 */
#include "bpfdefs.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Defaults; the Go loader may override max_entries before loading. */
#define MAX_FLOWS 65536
#define MAX_SOCKETS 64
#define MAX_FRAGS 8192

#define MAX_VLAN_TAGS 2
/* Hop-by-hop, routing, fragment, two destination-options headers and one
 * spare: more than any legitimate UDP packet carries. */
#define MAX_IPV6_EXT_HDRS 6

/* Keys hold addresses as 16 bytes; IPv4 as ::ffff:a.b.c.d. Ports are in
 * network byte order, exactly as on the wire. A 3-tuple (any source) entry
 * has saddr all zero and sport 0. vni is the VXLAN network identifier
 * (network order, as on the wire) of a flow inside an overlay, zero for a
 * flow of the interface itself; the other fields are then the inner
 * frame's. */
struct flow_key {
	__u8 proto;
	__u8 vni[3];
	__be16 dport;
	__be16 sport;
	__u8 daddr[16];
	__u8 saddr[16];
};

struct flow_val {
	__u32 slot;        /* index into xsks */
	__be16 vxlanport;  /* an overlay flow's VXLAN port, else 0 (for listing) */
	__u16 pad;
};

/* The VXLAN ports whose datagrams are looked into, with the number of
 * overlay flows using each (kept by the loader); port 0 is an empty entry.
 * One array entry, so the check costs one inlined lookup per UDP frame. */
#define MAX_VXLAN_PORTS 4
struct vxlan_ports {
	__be16 port[MAX_VXLAN_PORTS];
	__u32 refs[MAX_VXLAN_PORTS];
};

/* Identity of one fragmented datagram. proto is the IPv4 protocol field or
 * the Next Header of the IPv6 Fragment header (identical in every fragment
 * of a datagram). id is the IPv4 Identification (16 bits) or IPv6
 * Identification (32 bits), kept as raw wire bytes. */
struct frag_key {
	__u8 family;
	__u8 proto;
	__u8 pad[2];
	__u32 id;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Written by steer_ts immediately before the frame (the XDP metadata area,
 * data_meta .. data). magic tells the reader the area was written, so a
 * frame without it (plain program, metadata not copied) reads as absent;
 * status is the kfunc's return value (0: rx_ts valid, else -errno such as
 * -ENODATA or -EOPNOTSUPP); rx_ts is the NIC's receive time in ns on the
 * PHC's time scale, 0 when the device has no clock (veth). */
#define RX_META_MAGIC 0x62647473 /* arbitrary: bytes "stdb" in memory */
struct rx_meta {
	__u64 rx_ts;
	__s32 status;
	__u32 magic;
};

/* Written in front of every redirected frame (in front of rx_meta when
 * steer_ts wrote one): the flow's tag, which is its slot, the queue of the
 * ring that owns the flow (its home). An AF_XDP socket accepts only frames
 * of its own queue, so a frame RSS put on another queue is redirected to
 * that queue's socket; the tag tells the receiving ring where to hand it
 * without a second lookup. */
#define FLOW_META_MAGIC 0x62646674 /* arbitrary: bytes "tfdb" in memory */
struct flow_meta {
	__u32 home;
	__u32 magic;
};

enum counter_idx {
	CNT_REDIRECTED = 0, /* frames redirected into an XSK (fragments included) */
	CNT_PASSED,         /* frames that are not ours: XDP_PASS */
	CNT_NO_SOCKET,      /* matched a flow but no XSK at the slot / redirect refused */
	CNT_FRAGMENTS,      /* IP fragments redirected (subset of CNT_REDIRECTED) */
	CNT_MALFORMED,      /* truncated or inconsistent headers: XDP_PASS */
	CNT_OTHER_QUEUE,    /* redirected to the socket of the queue that received it,
			     * not the flow's home (a subset of CNT_REDIRECTED) */
	CNT_NO_QUEUE_SOCKET, /* matched a flow on a queue without a socket: XDP_PASS */
	CNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_SOCKETS);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FRAGS);
	__type(key, struct frag_key);
	__type(value, __u32);
} frags SEC(".maps");

/* five_tuples[0] counts the 5-tuple entries in flows, kept by the loader:
 * while it is 0 (the usual case) the 5-tuple lookup, a hash of a 40-byte key
 * that cannot hit, is skipped. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} five_tuples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vxlan_ports);
} vxlan_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

enum frag_kind {
	FRAG_NONE = 0, /* a whole datagram (includes IPv6 atomic fragments) */
	FRAG_FIRST,    /* offset 0, more fragments follow: carries the UDP header */
	FRAG_LATER,    /* offset != 0: no UDP header */
};

enum parse_result {
	PARSE_UDP,       /* key holds a full UDP or TCP 5-tuple */
	PARSE_LATER_FRAG, /* frag holds the identity of a non-first fragment */
	PARSE_NOT_OURS,
	PARSE_MALFORMED,
};

struct packet {
	struct flow_key key;
	struct frag_key frag;
	__u8 frag_kind;
	__u8 last_frag; /* FRAG_LATER with More Fragments clear */
	__u32 l4_off;   /* offset of a PARSE_UDP datagram's UDP header in the frame */
};

/* RFC 7348 section 5. */
struct vxlanhdr {
	__u8 flags; /* 0x08: the VNI is valid */
	__u8 reserved1[3];
	__u8 vni[3];
	__u8 reserved2;
};
#define VXLAN_FLAG_I 0x08

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);

	/* Per-CPU slot: a plain increment is race-free. */
	if (v)
		*v += 1;
}

static __always_inline void set_v4_mapped(__u8 dst[16], const __u8 src[4])
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, src, 4);
}

static __always_inline int parse_udp(void *data, void *cur, void *data_end,
				     struct packet *p)
{
	struct udphdr *udp = cur;

	if ((void *)(udp + 1) > data_end)
		return PARSE_MALFORMED;
	p->key.proto = IPPROTO_UDP;
	p->key.dport = udp->dest;
	p->key.sport = udp->source;
	p->l4_off = cur - data;
	return PARSE_UDP;
}

/* TCP: only unfragmented segments with the whole fixed header are ours;
 * the stack in the daemon does not reassemble IP fragments. */
static __always_inline int parse_tcp(void *cur, void *data_end,
				     struct packet *p)
{
	struct udphdr *ports = cur; /* TCP starts with the same two ports */

	if (p->frag_kind != FRAG_NONE)
		return PARSE_NOT_OURS;
	if (cur + 20 > data_end)
		return PARSE_MALFORMED;
	p->key.proto = IPPROTO_TCP;
	p->key.dport = ports->dest;
	p->key.sport = ports->source;
	return PARSE_UDP;
}

static __always_inline int parse_ipv4(void *data, void *cur, void *data_end,
				      struct packet *p)
{
	struct iphdr *iph = cur;
	__u32 ihl;
	__u16 frag;

	if ((void *)(iph + 1) > data_end)
		return PARSE_MALFORMED;
	if ((iph->ihl_version >> 4) != 4)
		return PARSE_MALFORMED;
	ihl = iph->ihl_version & 0x0f;
	if (ihl < 5)
		return PARSE_MALFORMED;

	set_v4_mapped(p->key.daddr, iph->daddr);
	set_v4_mapped(p->key.saddr, iph->saddr);

	frag = bpf_ntohs(iph->frag_off);
	if (frag & (IP_MF | IP_OFFSET)) {
		p->frag.family = AF_INET;
		p->frag.proto = iph->protocol;
		p->frag.id = iph->id;
		__builtin_memcpy(p->frag.saddr, p->key.saddr, 16);
		__builtin_memcpy(p->frag.daddr, p->key.daddr, 16);
		if (frag & IP_OFFSET) {
			p->frag_kind = FRAG_LATER;
			p->last_frag = !(frag & IP_MF);
			return iph->protocol == IPPROTO_UDP ? PARSE_LATER_FRAG
							    : PARSE_NOT_OURS;
		}
		p->frag_kind = FRAG_FIRST;
	}

	/* IHL is 4 bits, so the variable offset stays bounded (<= 60) for the
	 * verifier; options are skipped, not interpreted. */
	if (iph->protocol == IPPROTO_TCP)
		return parse_tcp(cur + ihl * 4, data_end, p);
	if (iph->protocol != IPPROTO_UDP)
		return PARSE_NOT_OURS;
	return parse_udp(data, cur + ihl * 4, data_end, p);
}

static __always_inline int parse_ipv6(void *data, void *cur, void *data_end,
				      struct packet *p)
{
	struct ipv6hdr *ip6 = cur;
	__u8 nexthdr;
	int i;

	if ((void *)(ip6 + 1) > data_end)
		return PARSE_MALFORMED;
	if ((ip6->priority_version >> 4) != 6)
		return PARSE_MALFORMED;

	__builtin_memcpy(p->key.daddr, ip6->daddr, 16);
	__builtin_memcpy(p->key.saddr, ip6->saddr, 16);
	nexthdr = ip6->nexthdr;
	cur = ip6 + 1;

#pragma unroll
	for (i = 0; i < MAX_IPV6_EXT_HDRS; i++) {
		if (nexthdr == IPPROTO_HOPOPTS || nexthdr == IPPROTO_ROUTING ||
		    nexthdr == IPPROTO_DSTOPTS) {
			struct ipv6_opt_hdr *opt = cur;

			if ((void *)(opt + 1) > data_end)
				return PARSE_MALFORMED;
			nexthdr = opt->nexthdr;
			/* hdrlen is 8 bits: each step adds at most 2048 bytes,
			 * keeping the offset bounded for the verifier. */
			cur += ((__u32)opt->hdrlen + 1) * 8;
		} else if (nexthdr == IPPROTO_FRAGMENT) {
			struct frag_hdr *fh = cur;
			__u16 off;

			if ((void *)(fh + 1) > data_end)
				return PARSE_MALFORMED;
			if (p->frag.family)
				return PARSE_MALFORMED; /* two Fragment headers */
			off = bpf_ntohs(fh->frag_off);
			nexthdr = fh->nexthdr;
			cur = fh + 1;
			if (!(off & (IP6_OFFSET | IP6_MF)))
				continue; /* atomic fragment: a whole datagram (RFC 6946) */
			p->frag.family = AF_INET6;
			p->frag.proto = nexthdr;
			p->frag.id = fh->identification;
			__builtin_memcpy(p->frag.saddr, p->key.saddr, 16);
			__builtin_memcpy(p->frag.daddr, p->key.daddr, 16);
			if (off & IP6_OFFSET) {
				p->frag_kind = FRAG_LATER;
				p->last_frag = !(off & IP6_MF);
				return PARSE_LATER_FRAG;
			}
			p->frag_kind = FRAG_FIRST;
		} else {
			break;
		}
	}

	if (nexthdr == IPPROTO_TCP)
		return parse_tcp(cur, data_end, p);
	if (nexthdr != IPPROTO_UDP)
		return PARSE_NOT_OURS; /* includes chains longer than we walk */
	return parse_udp(data, cur, data_end, p);
}

/* Parses the Ethernet frame at eth: the interface's, or the inner frame of
 * a VXLAN datagram. */
static __always_inline int parse_eth(void *data, struct ethhdr *eth,
				     void *data_end, struct packet *p)
{
	void *cur;
	__u16 proto;
	int i;

	if ((void *)(eth + 1) > data_end)
		return PARSE_MALFORMED;
	proto = eth->h_proto;
	cur = eth + 1;

#pragma unroll
	for (i = 0; i < MAX_VLAN_TAGS; i++) {
		struct vlan_hdr *vh = cur;

		if (proto != bpf_htons(ETH_P_8021Q) &&
		    proto != bpf_htons(ETH_P_8021AD))
			break;
		if ((void *)(vh + 1) > data_end)
			return PARSE_MALFORMED;
		proto = vh->h_vlan_encapsulated_proto;
		cur = vh + 1;
	}

	if (proto == bpf_htons(ETH_P_IP))
		return parse_ipv4(data, cur, data_end, p);
	if (proto == bpf_htons(ETH_P_IPV6))
		return parse_ipv6(data, cur, data_end, p);
	return PARSE_NOT_OURS;
}

static __always_inline int parse(struct xdp_md *ctx, struct packet *p)
{
	void *data = (void *)(long)ctx->data;

	return parse_eth(data, data, (void *)(long)ctx->data_end, p);
}

/* Reports whether p, a whole UDP datagram, goes to a VXLAN port in use. */
static __always_inline int to_vxlan_port(const struct packet *p)
{
	__u32 zero = 0;
	struct vxlan_ports *vp = bpf_map_lookup_elem(&vxlan_ports, &zero);
	int i;

	if (!vp || p->key.proto != IPPROTO_UDP || p->frag_kind != FRAG_NONE)
		return 0;
#pragma unroll
	for (i = 0; i < MAX_VXLAN_PORTS; i++) {
		if (vp->port[i] && vp->port[i] == p->key.dport)
			return 1;
	}
	return 0;
}

/* Replaces p, the outer datagram, by the inner frame's tuple and VNI. A
 * VXLAN header without a valid VNI is not ours: the kernel decides. */
static __always_inline int parse_vxlan(struct xdp_md *ctx, struct packet *p)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 off = p->l4_off;
	struct vxlanhdr *vx;
	__u8 vni[3];

	/* Headers end well before 4 KiB; the bound keeps the verifier's
	 * offset range finite. */
	if (off > 4096)
		return PARSE_NOT_OURS;
	vx = data + off + sizeof(struct udphdr);
	if ((void *)(vx + 1) > data_end)
		return PARSE_MALFORMED;
	if (!(vx->flags & VXLAN_FLAG_I))
		return PARSE_NOT_OURS;
	__builtin_memcpy(vni, vx->vni, 3);
	__builtin_memset(p, 0, sizeof(*p));
	__builtin_memcpy(p->key.vni, vni, 3);
	return parse_eth(data, (void *)(vx + 1), data_end, p);
}

/* Puts the frame's hardware receive timestamp into the metadata area. A
 * driver that cannot grow the area leaves the frame without one, which the
 * reader sees as "absent". */
static __always_inline void stamp(struct xdp_md *ctx)
{
	struct rx_meta *meta;
	__u64 ts = 0;
	int status;

	status = bpf_xdp_metadata_rx_timestamp(ctx, &ts);
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)))
		return;
	meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > (void *)(long)ctx->data)
		return;
	meta->rx_ts = ts;
	meta->status = status;
	meta->magic = RX_META_MAGIC;
}

/* Puts the flow's tag (its home slot) into the metadata area; non-zero
 * when the driver cannot grow the area. */
static __always_inline int tag(struct xdp_md *ctx, __u32 home)
{
	struct flow_meta *meta;

	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)))
		return -1;
	meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > (void *)(long)ctx->data)
		return -1;
	meta->home = home;
	meta->magic = FLOW_META_MAGIC;
	return 0;
}

/* Redirects a frame of the flow homed at slot into the socket of the queue
 * that received it, tagged with the home slot. The explicit lookups make
 * NO_SOCKET and NO_QUEUE_SOCKET exact; bpf_redirect_map's XDP_PASS fallback
 * still covers a socket removed between the lookup and the redirect. */
static __always_inline int redirect(struct xdp_md *ctx, __u32 slot,
				    int fragment, int with_ts)
{
	__u32 rxq = ctx->rx_queue_index;
	long act;

	if (!bpf_map_lookup_elem(&xsks, &slot)) {
		count(CNT_NO_SOCKET);
		return XDP_PASS;
	}
	if (rxq != slot && !bpf_map_lookup_elem(&xsks, &rxq)) {
		/* No ring serves the queue RSS chose: the socket at slot
		 * would refuse the frame (wrong queue) and it would be lost. */
		count(CNT_NO_QUEUE_SOCKET);
		return XDP_PASS;
	}
	if (with_ts)
		stamp(ctx);
	if (tag(ctx, slot) && rxq != slot) {
		/* Untagged, the receiving ring could not find the home ring. */
		count(CNT_NO_QUEUE_SOCKET);
		return XDP_PASS;
	}
	act = bpf_redirect_map(&xsks, rxq, XDP_PASS);
	if (act != XDP_REDIRECT) {
		count(CNT_NO_SOCKET);
		return XDP_PASS;
	}
	count(CNT_REDIRECTED);
	if (rxq != slot)
		count(CNT_OTHER_QUEUE);
	if (fragment)
		count(CNT_FRAGMENTS);
	return XDP_REDIRECT;
}

static __always_inline int steer_frame(struct xdp_md *ctx, int with_ts)
{
	struct packet p;
	struct flow_val *val;
	__u32 *fslot;
	__u32 slot;
	int res;

	__builtin_memset(&p, 0, sizeof(p));

	res = parse(ctx, &p);
	if (res == PARSE_UDP && to_vxlan_port(&p))
		res = parse_vxlan(ctx, &p);
	switch (res) {
	case PARSE_UDP:
		break;
	case PARSE_LATER_FRAG:
		/* Only a first fragment that matched a flow records the
		 * identity; a later fragment overtaking its first fragment
		 * therefore goes to the kernel. */
		fslot = bpf_map_lookup_elem(&frags, &p.frag);
		if (!fslot) {
			count(CNT_PASSED);
			return XDP_PASS;
		}
		slot = *fslot;
		if (p.last_frag)
			bpf_map_delete_elem(&frags, &p.frag);
		return redirect(ctx, slot, 1, with_ts);
	case PARSE_MALFORMED:
		count(CNT_MALFORMED);
		return XDP_PASS;
	default:
		count(CNT_PASSED);
		return XDP_PASS;
	}

	__u32 zero = 0;
	__u32 *n5 = bpf_map_lookup_elem(&five_tuples, &zero);

	val = NULL;
	if (n5 && *n5)
		val = bpf_map_lookup_elem(&flows, &p.key);
	if (!val) {
		__builtin_memset(p.key.saddr, 0, sizeof(p.key.saddr));
		p.key.sport = 0;
		val = bpf_map_lookup_elem(&flows, &p.key);
	}
	if (!val) {
		/* A recycled identity (IPv4 IDs wrap quickly) must not pull
		 * this datagram's later fragments into an old flow's socket. */
		if (p.frag_kind == FRAG_FIRST)
			bpf_map_delete_elem(&frags, &p.frag);
		count(CNT_PASSED);
		return XDP_PASS;
	}
	slot = val->slot;
	if (p.frag_kind == FRAG_FIRST)
		bpf_map_update_elem(&frags, &p.frag, &slot, BPF_ANY);
	return redirect(ctx, slot, p.frag_kind != FRAG_NONE, with_ts);
}

SEC("xdp")
int steer(struct xdp_md *ctx)
{
	return steer_frame(ctx, 0);
}

/* Loaded device-bound (BPF_F_XDP_DEV_BOUND_ONLY with the interface's
 * ifindex), which the metadata kfunc requires. */
SEC("xdp")
int steer_ts(struct xdp_md *ctx)
{
	return steer_frame(ctx, 1);
}
