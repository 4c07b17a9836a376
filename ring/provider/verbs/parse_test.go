//go:build verbs

package verbs

import (
	"encoding/binary"
	"reflect"
	"testing"
)

// connectX5 is what a ConnectX-5 port typically reports (values as
// ibv_devinfo -v prints them).
func connectX5() rawCaps {
	var guid [8]byte
	binary.BigEndian.PutUint64(guid[:], 0x248a070300b1c2d3)
	return rawCaps{
		FWVer: "16.35.2000", NodeGUID: binary.NativeEndian.Uint64(guid[:]),
		VendorID: 0x02c9, VendorPartID: 4119, HWVer: 0,
		MaxQP: 262144, MaxQPWR: 32768, MaxCQE: 4194303, PhysPortCnt: 1,
		TSMask: 0x7fffffffffffffff, CoreClockKHz: 156250,
		PPMin: 1000, PPMax: 100000000, PPQPTypes: 1 << 8,
		RawPacketCap: rawCapCVLANStripping | rawCapScatterFCS | rawCapIPCsum,
		MaxDMSize:    131072, TSOMax: 262144, TSOQPTypes: 1 << 8,
		PortQueried: true, PortState: portActive, LinkLayer: linkLayerEthernet, ActiveMTU: 3,
	}
}

func TestParseCaps(t *testing.T) {
	c := parseCaps(Binding{Device: "mlx5_0", Port: 1}, connectX5())
	want := DeviceCaps{
		Device: "mlx5_0", Port: 1, Firmware: "16.35.2000", NodeGUID: "248a:0703:00b1:c2d3",
		VendorID: 0x02c9, VendorPartID: 4119, Ports: 1, MaxQP: 262144, MaxQPWR: 32768, MaxCQE: 4194303,
		PortState: "active", LinkLayer: "ethernet", ActiveMTU: 1024, RawPacket: true,
		RawPacketCaps: []string{"cvlan_stripping", "scatter_fcs", "ip_csum"}, MaxTSO: 262144,
		Pacing:       &PacingCaps{MinKbps: 1000, MaxKbps: 100000000, QPTypes: []string{"raw_packet"}},
		DeviceMemory: 131072, CompletionTimestamps: true, ClockKHz: 156250, TimestampMask: 0x7fffffffffffffff,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parseCaps:\n got %+v\nwant %+v", c, want)
	}
	if c.ClockHz() != 156_250_000 {
		t.Fatalf("ClockHz %d: hca_core_clock is kHz", c.ClockHz())
	}
	rl := c.RateLimitCaps()
	if rl == nil || rl.MinKbps != 1000 || rl.MaxKbps != 100000000 || rl.Burst {
		t.Fatalf("RateLimitCaps %+v", rl)
	}
}

func TestParseCapsWithout(t *testing.T) {
	r := connectX5()
	r.PPQPTypes = 1 << 2 // pacing for RC only: not ours
	r.TSMask, r.CoreClockKHz = 0, 0
	r.TSOQPTypes = 0
	r.LinkLayer = linkLayerInfiniband
	r.PortState = 1
	r.ActiveMTU = 0
	c := parseCaps(Binding{Device: "mlx5_1", Port: 1}, r)
	if c.Pacing != nil || c.RateLimitCaps() != nil {
		t.Errorf("pacing reported for a device that cannot pace raw packet QPs: %+v", c.Pacing)
	}
	if c.CompletionTimestamps || c.ClockHz() != 0 || c.MaxTSO != 0 {
		t.Errorf("timestamps/clock/TSO reported: %+v", c)
	}
	if c.RawPacket || c.LinkLayer != "infiniband" || c.PortState != "down" || c.ActiveMTU != 0 {
		t.Errorf("InfiniBand port: %+v", c)
	}
	r = connectX5()
	r.PPMin, r.PPMax = 5000, 1000 // nonsense range
	if c := parseCaps(Binding{}, r); c.Pacing != nil {
		t.Errorf("inverted pacing range accepted: %+v", c.Pacing)
	}
	r.PortQueried = false
	if c := parseCaps(Binding{}, r); c.RawPacket || c.PortState != "" {
		t.Errorf("unqueried port reported: %+v", c)
	}
	if got := qpTypes(1<<2 | 1<<8 | 1<<20); !reflect.DeepEqual(got, []string{"rc", "raw_packet", "qp_type_20"}) {
		t.Errorf("qpTypes = %v", got)
	}
}
