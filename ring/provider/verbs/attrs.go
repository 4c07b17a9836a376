//go:build verbs

package verbs

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
)

// Values from rdma-core's verbs.h that the Go side uses to build attributes.
// cverbs.go checks every one against the header at compile time, so a
// header that disagrees fails the build instead of misprogramming a device.
const (
	qpsReset = 0 // enum ibv_qp_state
	qpsInit  = 1
	qpsRTR   = 2
	qpsRTS   = 3

	qpAttrState = 1 << 0 // enum ibv_qp_attr_mask
	qpAttrPort  = 1 << 5

	qptRawPacket = 8 // enum ibv_qp_type

	sendSignaled = 1 << 1 // enum ibv_send_flags
	sendInline   = 1 << 3
	sendIPCsum   = 1 << 4

	wrSend = 2 // enum ibv_wr_opcode
	wrTSO  = 10

	wcSuccess    = 0 // enum ibv_wc_status
	wcFlushError = 5

	wcExWithByteLen             = 1 << 0 // enum ibv_create_cq_wc_flags
	wcExWithCompletionTimestamp = 1 << 7

	flowAttrNormal = 0x0 // enum ibv_flow_attr_type
	flowSpecEth    = 0x20
	flowSpecIPv4   = 0x30
	flowSpecIPv6   = 0x31
	flowSpecUDP    = 0x41

	// Sizes of the flow structs (verbs.h), checked in cverbs.go.
	flowAttrSize     = 20
	flowSpecEthSize  = 40
	flowSpecIPv4Size = 24
	flowSpecIPv6Size = 88
	flowSpecUDPSize  = 16
)

// qpStep is one ibv_modify_qp call of the state walk.
type qpStep struct {
	Name  string
	State int
	Mask  int
	Port  uint8
}

// qpWalk is the walk that makes a fresh raw packet QP usable: RESET → INIT
// (the only step that names the port) → RTR (it can receive) → RTS (it can
// send). A raw packet QP has no remote side, so unlike a connected QP no
// addresses, PSNs or timeouts are set on the way.
func qpWalk(port uint8) []qpStep {
	return []qpStep{
		{Name: "INIT", State: qpsInit, Mask: qpAttrState | qpAttrPort, Port: port},
		{Name: "RTR", State: qpsRTR, Mask: qpAttrState},
		{Name: "RTS", State: qpsRTS, Mask: qpAttrState},
	}
}

// walkQP runs the walk with modify (ibv_modify_qp) and names the step that
// failed, with what it usually means.
func walkQP(port uint8, modify func(qpStep) error) error {
	for _, st := range qpWalk(port) {
		if err := modify(st); err != nil {
			return translate("move the raw packet QP to "+st.Name, err)
		}
	}
	return nil
}

// flowPriority: a rule that names the source (5-tuple) must win over the
// destination-only rule (3-tuple) of the same socket address, as in the XDP
// program. In verbs a lower number is a higher priority.
func flowPriority(f qp.Flow) uint16 {
	if f.Src.IsValid() {
		return 0
	}
	return 1
}

// flowMAC is the destination MAC a flow's frames carry: the interface's own
// for unicast, the mapped group MAC for multicast (RFC 1112 for IPv4, RFC
// 2464 for IPv6), all ones for the IPv4 broadcast.
func flowMAC(dst netip.Addr, own net.HardwareAddr) (mac [6]byte, err error) {
	switch {
	case dst.Is4() && dst.IsMulticast():
		b := dst.As4()
		return [6]byte{0x01, 0x00, 0x5e, b[1] & 0x7f, b[2], b[3]}, nil
	case dst.Is6() && dst.IsMulticast():
		b := dst.As16()
		return [6]byte{0x33, 0x33, b[12], b[13], b[14], b[15]}, nil
	case dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, nil
	}
	if len(own) != 6 {
		return mac, fmt.Errorf("interface MAC %v is not a 6-byte Ethernet address", own)
	}
	copy(mac[:], own)
	return mac, nil
}

// flowRule encodes the ibv_flow_attr that steers f to a QP on port: an
// ibv_flow_attr followed by Ethernet, IPv4 or IPv6, and UDP specs, in the
// host's byte order for the struct fields and network order for the match
// values, as verbs.h lays them out. Only the fields the flow names are
// masked in, so a 3-tuple rule matches any source.
func flowRule(f qp.Flow, own net.HardwareAddr, port uint8) ([]byte, error) {
	if f.Proto != unix.IPPROTO_UDP {
		return nil, fmt.Errorf("flow %s: only UDP flows are steered", f)
	}
	if !f.Dst.IsValid() || f.Dst.Port() == 0 {
		return nil, fmt.Errorf("flow %s: destination address and port are required", f)
	}
	dst := f.Dst.Addr().Unmap()
	src := f.Src.Addr().Unmap()
	if f.Src.IsValid() && src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("flow %s: source and destination are of different families", f)
	}
	mac, err := flowMAC(dst, own)
	if err != nil {
		return nil, fmt.Errorf("flow %s: %w", f, err)
	}
	ipSize := flowSpecIPv6Size
	if dst.Is4() {
		ipSize = flowSpecIPv4Size
	}
	total := flowAttrSize + flowSpecEthSize + ipSize + flowSpecUDPSize
	b := make([]byte, total)
	ne := binary.NativeEndian
	be := binary.BigEndian

	// struct ibv_flow_attr
	ne.PutUint32(b[0:], 0)              // comp_mask
	ne.PutUint32(b[4:], flowAttrNormal) // type
	ne.PutUint16(b[8:], uint16(total))  // size
	ne.PutUint16(b[10:], flowPriority(f))
	b[12] = 3    // num_of_specs
	b[13] = port // port
	ne.PutUint32(b[16:], 0)

	// struct ibv_flow_spec_eth: val at 6, mask at 22 (16-byte filters).
	e := b[flowAttrSize:]
	ne.PutUint32(e[0:], flowSpecEth)
	ne.PutUint16(e[4:], flowSpecEthSize)
	copy(e[6:12], mac[:])
	etype := uint16(unix.ETH_P_IPV6)
	if dst.Is4() {
		etype = unix.ETH_P_IP
	}
	be.PutUint16(e[18:], etype)
	copy(e[22:28], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	be.PutUint16(e[34:], 0xffff)

	// struct ibv_flow_spec_ipv4 (val at 8: src, dst; mask at 16) or
	// struct ibv_flow_spec_ipv6 (val at 8: src[16], dst[16], ...; mask at 48).
	ip := e[flowSpecEthSize:]
	if dst.Is4() {
		ne.PutUint32(ip[0:], flowSpecIPv4)
		ne.PutUint16(ip[4:], flowSpecIPv4Size)
		d := dst.As4()
		copy(ip[12:16], d[:])
		copy(ip[20:24], []byte{0xff, 0xff, 0xff, 0xff})
		if f.Src.IsValid() {
			s := src.As4()
			copy(ip[8:12], s[:])
			copy(ip[16:20], []byte{0xff, 0xff, 0xff, 0xff})
		}
	} else {
		ne.PutUint32(ip[0:], flowSpecIPv6)
		ne.PutUint16(ip[4:], flowSpecIPv6Size)
		d := dst.As16()
		copy(ip[24:40], d[:])
		for i := 64; i < 80; i++ {
			ip[i] = 0xff
		}
		if f.Src.IsValid() {
			s := src.As16()
			copy(ip[8:24], s[:])
			for i := 48; i < 64; i++ {
				ip[i] = 0xff
			}
		}
	}

	// struct ibv_flow_spec_tcp_udp: val {dst_port, src_port} at 6, mask at 10.
	u := ip[ipSize:]
	ne.PutUint32(u[0:], flowSpecUDP)
	ne.PutUint16(u[4:], flowSpecUDPSize)
	be.PutUint16(u[6:], f.Dst.Port())
	be.PutUint16(u[10:], 0xffff)
	if f.Src.IsValid() && f.Src.Port() != 0 {
		be.PutUint16(u[8:], f.Src.Port())
		be.PutUint16(u[12:], 0xffff)
	}
	return b, nil
}

// checkRateLimit refuses a setting the device cannot take, with the range in
// the message; 0 kbit/s removes the limit and is always accepted.
func checkRateLimit(rl qp.RateLimit, pc *PacingCaps) error {
	if pc == nil {
		return fmt.Errorf("the device has no packet pacing on raw packet QPs: %w", unix.EOPNOTSUPP)
	}
	if rl.Kbps == 0 {
		return nil
	}
	if rl.Kbps < pc.MinKbps || rl.Kbps > pc.MaxKbps {
		return fmt.Errorf("rate %d kbit/s is outside the device's range %d..%d kbit/s: %w",
			rl.Kbps, pc.MinKbps, pc.MaxKbps, unix.ERANGE)
	}
	return nil
}

// pacedDepth bounds the send queue of a paced QP: it drains at its rate,
// so a deep queue would only hold device memory (64 of them by default).
const pacedDepth = 256

// ring sizes derived from the configuration and the device's limits.
type queueSizes struct {
	RXFrames, TXFrames int
	// SendWR and RecvWR size the main QP, PacedWR each paced QP; the CQEs
	// the completion queues.
	SendWR, RecvWR, PacedWR, SendCQE, RecvCQE int
}

// sizeQueues splits cfg.Frames between reception and transmission and
// clamps the work-queue depths to what the device allows. Paced send queues
// share the send CQ, so it is sized for all of them (a CQ that overflows
// puts the device in an error state).
func sizeQueues(cfg Config, c DeviceCaps) (queueSizes, error) {
	rx := cfg.Frames / 2
	tx := cfg.Frames - rx
	if c.MaxQPWR > 0 {
		rx = min(rx, c.MaxQPWR)
	}
	s := queueSizes{RXFrames: rx, TXFrames: tx, SendWR: tx, RecvWR: rx}
	if c.MaxQPWR > 0 {
		s.SendWR = min(s.SendWR, c.MaxQPWR)
	}
	s.PacedWR = min(s.SendWR, pacedDepth)
	s.RecvCQE = rx
	s.SendCQE = s.SendWR + s.PacedWR*cfg.MaxPacedQueues
	if c.MaxCQE > 0 {
		s.RecvCQE = min(s.RecvCQE, c.MaxCQE)
		s.SendCQE = min(s.SendCQE, c.MaxCQE)
	}
	if s.RecvWR < 1 || s.SendWR < 1 || s.RecvCQE < 1 || s.SendCQE < 1 {
		return s, fmt.Errorf("queue sizes %+v: the device allows too few work requests (max_qp_wr %d, max_cqe %d)",
			s, c.MaxQPWR, c.MaxCQE)
	}
	return s, nil
}
