package bpf

import "encoding/binary"

// RXMeta layout: what the timestamping variant of the program (steer_ts,
// Options.RXTimestamps) writes into the XDP metadata area, the RXMetaSize
// bytes immediately before a redirected frame (struct rx_meta in
// c/steer.c; clang leaves it out of the BTF, so a lab test checks it
// against what the loaded program writes):
//
//	off size field
//	  0    8 rx_ts: receive time in ns on the NIC's PHC time scale (0: none)
//	  8    4 status: bpf_xdp_metadata_rx_timestamp's result (0 or -errno)
//	 12    4 magic: RXMetaMagic, written last
const (
	RXMetaSize  = 16
	RXMetaMagic = 0x62647473
)

// ParseRXMeta decodes the RXMetaSize bytes in front of a frame. present is
// false when the program did not write them (no magic); ts is the hardware
// receive time, 0 when the driver gave none (status then says why: for
// example -ENODATA or -EOPNOTSUPP, or 0 with ts 0 on devices without a
// clock, such as veth).
func ParseRXMeta(b []byte) (ts uint64, status int32, present bool) {
	if len(b) < RXMetaSize || binary.LittleEndian.Uint32(b[12:]) != RXMetaMagic {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(b[0:]), int32(binary.LittleEndian.Uint32(b[8:])), true
}

// FlowMeta layout: what both variants of the program write in front of
// every redirected frame, before RXMeta when the timestamping variant wrote
// one (struct flow_meta in c/steer.c):
//
//	off size field
//	  0    4 home: the flow's slot, the queue of the ring that owns it
//	  4    4 magic: FlowMetaMagic
const (
	FlowMetaSize  = 8
	FlowMetaMagic = 0x62646674
)

// ParseFlowMeta decodes the FlowMetaSize bytes of a flow tag. present is
// false when the program did not write them (a driver without metadata
// room): then the frame arrived on its flow's home queue.
func ParseFlowMeta(b []byte) (home uint32, present bool) {
	if len(b) < FlowMetaSize || binary.LittleEndian.Uint32(b[4:]) != FlowMetaMagic {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[0:]), true
}
