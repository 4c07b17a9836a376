//go:build verbs

package verbs

import "fmt"

// MTU. A raw packet QP carries Ethernet frames as large as the port's
// Ethernet MTU, which is the interface's (the ring reads it, ring/mtu.go):
// receive buffers hold a whole frame of it, so Open sizes them from
// Config.MTU (RecvBufferSize). ibv_query_port's active MTU is the RoCE
// MTU, an InfiniBand MTU (256..4096) that the driver derives from the
// interface MTU — the largest one whose RoCE packet still fits it (the RoCE
// document's "port MTU against the interface MTU"): it bounds RDMA
// transport messages, not raw Ethernet frames, and is below the interface
// MTU on every healthy port (1024 at MTU 1500, 4096 at 9000). A port whose
// active MTU exceeds the interface MTU has not followed it, or is not the
// interface's port: frames of that size would not fit the interface, so
// Open refuses it with the reason (CheckPortMTU).

// maxFrameSize is the largest receive buffer (Config.FrameSize's limit).
const maxFrameSize = 16384

// frameOverhead is what an Ethernet frame adds to the MTU: the header and
// one 802.1Q tag.
const frameOverhead = 18

// RecvBufferSize is the buffer size a verbs ring uses for an interface
// MTU: frameSize if it holds a whole frame, else the next power of two
// that does, up to 16384 bytes (MTU 16366); larger MTUs are refused.
func RecvBufferSize(mtu, frameSize int) (int, error) {
	size := max(frameSize, 256)
	for size < mtu+frameOverhead {
		size *= 2
	}
	if size > maxFrameSize {
		return 0, fmt.Errorf("MTU %d: the verbs provider's receive buffers hold at most %d-byte frames (MTU %d): lower the MTU or use --provider afxdp",
			mtu, maxFrameSize, maxFrameSize-frameOverhead)
	}
	return size, nil
}

// CheckPortMTU refuses an RDMA port whose active MTU (ibv_query_port) is
// larger than the MTU of its interface iface: the two disagree (see
// above). An unknown interface MTU (0) or active MTU (0) is not checked.
func CheckPortMTU(iface string, ifMTU int, c DeviceCaps) error {
	if ifMTU <= 0 || c.ActiveMTU <= 0 || c.ActiveMTU <= ifMTU {
		return nil
	}
	return fmt.Errorf("RDMA device %s port %d has active MTU %d, larger than %s's MTU %d: the port and the interface disagree "+
		"(the RoCE MTU is derived from the interface MTU and cannot exceed it); check that %s is the port's interface (`rdma link`), "+
		"set its MTU again (`ip link set %s mtu %d`) so the port follows, or use --provider afxdp",
		c.Device, c.Port, c.ActiveMTU, iface, ifMTU, iface, iface, ifMTU)
}
