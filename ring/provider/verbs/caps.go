package verbs

import "github.com/bypassd/bypassd/ring/qp"

// DeviceCaps are the facts about an RDMA device and port that bypassd uses,
// the ones `ibv_devinfo -v` shows, as the devices topic of the control
// socket reports them.
type DeviceCaps struct {
	// Device and Port name the RDMA device (e.g. mlx5_0) and its port
	// (from 1) behind the interface.
	Device string `json:"device"`
	Port   int    `json:"port"`

	Firmware     string `json:"firmware"`
	NodeGUID     string `json:"node_guid"`
	VendorID     uint32 `json:"vendor_id"`
	VendorPartID uint32 `json:"vendor_part_id"`
	HWVersion    uint32 `json:"hw_version"`
	Ports        int    `json:"ports"`
	MaxQP        int    `json:"max_qp"`
	MaxQPWR      int    `json:"max_qp_wr"`
	MaxCQE       int    `json:"max_cqe"`

	// PortState is the port's logical state ("active", "down", ...) and
	// LinkLayer "ethernet" or "infiniband"; ActiveMTU is in bytes.
	PortState string `json:"port_state"`
	LinkLayer string `json:"link_layer"`
	ActiveMTU int    `json:"active_mtu"`

	// RawPacket reports that the port can carry raw Ethernet QPs (an
	// Ethernet link layer); opening one still needs CAP_NET_RAW.
	RawPacket bool `json:"raw_packet"`
	// RawPacketCaps lists the raw packet QP offloads: cvlan_stripping,
	// scatter_fcs, ip_csum, delay_drop.
	RawPacketCaps []string `json:"raw_packet_caps,omitempty"`
	// MaxTSO is the largest TSO a raw packet QP can send (0: none).
	MaxTSO uint32 `json:"max_tso"`

	// Pacing is the packet pacing range of raw packet QPs; nil when the
	// device cannot pace them.
	Pacing *PacingCaps `json:"pacing,omitempty"`
	// DeviceMemory is the on-device memory ibv_alloc_dm can hand out, in
	// bytes (0: none).
	DeviceMemory uint64 `json:"device_memory"`
	// CompletionTimestamps reports timestamps in completions; ClockKHz is
	// the device clock (hca_core_clock, which rdma-core gives in kHz; 0:
	// unknown) and TimestampMask the valid bits of a timestamp.
	CompletionTimestamps bool   `json:"completion_timestamps"`
	ClockKHz             uint64 `json:"clock_khz"`
	TimestampMask        uint64 `json:"timestamp_mask"`
}

// PacingCaps is the device's packet pacing range, in kbit/s.
type PacingCaps struct {
	MinKbps uint32 `json:"min_kbps"`
	MaxKbps uint32 `json:"max_kbps"`
	// QPTypes lists the QP types that can be paced (e.g. raw_packet).
	QPTypes []string `json:"qp_types"`
	// Burst reports whether max burst and typical packet size can be set.
	// Generic verbs do not report it (mlx5 keeps it to itself), so it is
	// false unless known; a refused burst setting is explained then.
	Burst bool `json:"burst"`
}

// RateLimitCaps converts the pacing range for qp.Caps (nil without pacing).
func (c *DeviceCaps) RateLimitCaps() *qp.RateLimitCaps {
	if c.Pacing == nil {
		return nil
	}
	return &qp.RateLimitCaps{MinKbps: c.Pacing.MinKbps, MaxKbps: c.Pacing.MaxKbps, Burst: c.Pacing.Burst}
}

// ClockHz is the nominal tick rate of completion timestamps and of the
// device clock, in Hz (0: unknown).
func (c *DeviceCaps) ClockHz() uint64 { return c.ClockKHz * 1000 }
