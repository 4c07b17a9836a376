//go:build verbs

package verbs

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// More verbs.h values (checked in cverbs.go).
const (
	linkLayerInfiniband = 1 // enum ibv_link_layer (IBV_LINK_LAYER_*)
	linkLayerEthernet   = 2

	portActive = 4 // enum ibv_port_state

	rawCapCVLANStripping = 1 << 0 // enum ibv_raw_packet_caps
	rawCapScatterFCS     = 1 << 1
	rawCapIPCsum         = 1 << 2
	rawCapDelayDrop      = 1 << 3

	eventCQError     = 0 // enum ibv_event_type
	eventQPFatal     = 1
	eventDeviceFatal = 8
)

// rawCaps is what cQuery copies out of ibv_device_attr_ex and
// ibv_port_attr, unconverted.
type rawCaps struct {
	FWVer                   string
	NodeGUID                uint64
	VendorID, VendorPartID  uint32
	HWVer                   uint32
	MaxQP, MaxQPWR, MaxCQE  int32
	PhysPortCnt             uint8
	CapFlags                uint64
	TSMask                  uint64
	CoreClockKHz            uint64
	PPMin, PPMax, PPQPTypes uint32
	RawPacketCap            uint32
	MaxDMSize               uint64
	TSOMax, TSOQPTypes      uint32
	PortQueried             bool
	PortState, LinkLayer    uint8
	ActiveMTU               uint8
}

// qpTypeNames names the bits of a supported_qpts mask (bit = enum
// ibv_qp_type value).
var qpTypeNames = map[int]string{2: "rc", 3: "uc", 4: "ud", 8: "raw_packet", 9: "xrc_send", 10: "xrc_recv"}

func qpTypes(mask uint32) []string {
	var out []string
	for m := mask; m != 0; m &= m - 1 {
		b := bits.TrailingZeros32(m)
		if n, ok := qpTypeNames[b]; ok {
			out = append(out, n)
		} else {
			out = append(out, fmt.Sprintf("qp_type_%d", b))
		}
	}
	return out
}

var portStates = [...]string{"nop", "down", "init", "armed", "active", "active_defer"}

// parseCaps turns the raw attributes into DeviceCaps. Pacing counts only when
// raw packet QPs are among the paceable QP types and the range is sane;
// hca_core_clock is kHz in rdma-core (verbs.h's ibv_query_device_ex(3):
// "The frequency (in kHZ) of the HCA").
func parseCaps(b Binding, r rawCaps) DeviceCaps {
	c := DeviceCaps{
		Device:       b.Device,
		Port:         b.Port,
		Firmware:     r.FWVer,
		NodeGUID:     formatGUID(r.NodeGUID),
		VendorID:     r.VendorID,
		VendorPartID: r.VendorPartID,
		HWVersion:    r.HWVer,
		Ports:        int(r.PhysPortCnt),
		MaxQP:        int(max(r.MaxQP, 0)),
		MaxQPWR:      int(max(r.MaxQPWR, 0)),
		MaxCQE:       int(max(r.MaxCQE, 0)),
		DeviceMemory: r.MaxDMSize,
		ClockKHz:     r.CoreClockKHz,
		// A device without timestamps reports a zero mask.
		CompletionTimestamps: r.TSMask != 0,
		TimestampMask:        r.TSMask,
	}
	if r.PortQueried {
		c.PortState = fmt.Sprintf("state_%d", r.PortState)
		if int(r.PortState) < len(portStates) {
			c.PortState = portStates[r.PortState]
		}
		switch r.LinkLayer {
		case linkLayerEthernet:
			c.LinkLayer = "ethernet"
		case linkLayerInfiniband, 0:
			// 0 (unspecified) is InfiniBand for old kernels.
			c.LinkLayer = "infiniband"
		default:
			c.LinkLayer = fmt.Sprintf("link_layer_%d", r.LinkLayer)
		}
		if r.ActiveMTU >= 1 && r.ActiveMTU <= 5 {
			c.ActiveMTU = 128 << r.ActiveMTU
		}
		c.RawPacket = r.LinkLayer == linkLayerEthernet
	}
	for _, f := range []struct {
		bit  uint32
		name string
	}{{rawCapCVLANStripping, "cvlan_stripping"}, {rawCapScatterFCS, "scatter_fcs"}, {rawCapIPCsum, "ip_csum"}, {rawCapDelayDrop, "delay_drop"}} {
		if r.RawPacketCap&f.bit != 0 {
			c.RawPacketCaps = append(c.RawPacketCaps, f.name)
		}
	}
	if r.TSOQPTypes&(1<<qptRawPacket) != 0 {
		c.MaxTSO = r.TSOMax
	}
	if r.PPQPTypes&(1<<qptRawPacket) != 0 && r.PPMax > 0 && r.PPMin <= r.PPMax {
		c.Pacing = &PacingCaps{MinKbps: r.PPMin, MaxKbps: r.PPMax, QPTypes: qpTypes(r.PPQPTypes)}
	}
	return c
}

// formatGUID prints a node GUID the way ibv_devinfo does (16-bit groups);
// verbs gives it in network byte order (__be64) in host memory.
func formatGUID(g uint64) string {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], g)
	v := binary.BigEndian.Uint64(b[:])
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48, (v>>32)&0xffff, (v>>16)&0xffff, v&0xffff)
}
