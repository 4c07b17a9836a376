/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * bpfdefs.h: the small, fixed subset of the kernel's BPF and networking ABI
 * that steer.c uses.
 *
 * Why not vmlinux.h or libbpf's headers: everything declared here is stable
 * UAPI/wire format (helper numbers, map type numbers, XDP actions, protocol
 * headers), so pinning it in the repository makes the compiled object depend
 * only on the clang version, not on the kernel or libbpf-dev of the machine
 * that runs `go generate`. steer.c is built with -nostdinc so nothing else
 * can leak in.
 */
#ifndef BYPASSD_BPFDEFS_H
#define BYPASSD_BPFDEFS_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;

#define NULL ((void *)0)

/* ---- BPF object-file conventions (understood by cilium/ebpf) ---------- */

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF-defined map attributes: the value is encoded in the array dimension
 * or pointee type so that the loader can read it from BTF. */
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name

/* ---- UAPI constants (include/uapi/linux/bpf.h) ------------------------- */

enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_XSKMAP = 17,
};

enum {
	BPF_ANY = 0,
};

enum xdp_action {
	XDP_ABORTED = 0,
	XDP_DROP,
	XDP_PASS,
	XDP_TX,
	XDP_REDIRECT,
};

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

/* ---- Helpers (numbers are fixed by the kernel ABI) --------------------- */

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key,
				   const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;
static long (*bpf_xdp_adjust_meta)(struct xdp_md *xdp_md, int delta) = (void *)54;

/* ---- Kernel functions (kfuncs), resolved by the loader through BTF ----- */

#define __ksym __attribute__((section(".ksyms")))

/* XDP RX metadata (Linux 6.3+): only in device-bound programs. Returns 0
 * and the NIC's receive time in ns, or -EOPNOTSUPP / -ENODATA. */
extern int bpf_xdp_metadata_rx_timestamp(const struct xdp_md *ctx,
					 __u64 *timestamp) __ksym;

/* ---- Byte order (BPF targets built here are little-endian only) -------- */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "steer.c is built for bpfel only"
#endif
#define bpf_htons(x) ((__be16)__builtin_bswap16(x))
#define bpf_ntohs(x) ((__u16)__builtin_bswap16(x))
#define bpf_ntohl(x) ((__u32)__builtin_bswap32(x))

/* ---- Wire formats ------------------------------------------------------ */

#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8

#define IPPROTO_HOPOPTS 0
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_DSTOPTS 60

#define AF_INET 2
#define AF_INET6 10

struct ethhdr {
	__u8 h_dest[ETH_ALEN];
	__u8 h_source[ETH_ALEN];
	__be16 h_proto;
};

struct vlan_hdr {
	__be16 h_vlan_TCI;
	__be16 h_vlan_encapsulated_proto;
};

struct iphdr {
	__u8 ihl_version; /* low nibble IHL, high nibble version (little-endian bitfield order) */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__u8 saddr[4];
	__u8 daddr[4];
};

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

struct ipv6hdr {
	__u8 priority_version;
	__u8 flow_lbl[3];
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Generic layout shared by hop-by-hop, routing and destination options. */
struct ipv6_opt_hdr {
	__u8 nexthdr;
	__u8 hdrlen; /* in 8-octet units, not counting the first 8 octets */
};

struct frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* offset << 3 | M flag (bit 0) */
	__be32 identification;
};

#define IP6_MF 0x0001
#define IP6_OFFSET 0xFFF8

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__u16 check;
};

#endif /* BYPASSD_BPFDEFS_H */
