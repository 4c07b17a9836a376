package ctldoc

import "github.com/bypassd/bypassd/ring/provider/verbs"

// TopicDevices is the devices topic: what each served interface's NIC
// offers and how the daemon uses it (bypassctl devices).
const TopicDevices = "devices"

// DevicesDoc answers TopicDevices.
type DevicesDoc struct {
	Devices []DeviceDoc `json:"devices"`
}

// DeviceDoc is one interface the daemon serves.
type DeviceDoc struct {
	Interface string `json:"interface"`
	// Driver and BusInfo are what `ethtool -i` reports (empty when it
	// cannot tell); RXQueues and TXQueues the interface's queue counts.
	Driver   string `json:"driver,omitempty"`
	BusInfo  string `json:"bus_info,omitempty"`
	RXQueues int    `json:"rx_queues"`
	TXQueues int    `json:"tx_queues"`

	// Provider, Mode and ZeroCopy describe the rings (the first ring's
	// when they differ); Queues lists the queues the daemon serves.
	Provider string `json:"provider"`
	Mode     string `json:"mode"`
	ZeroCopy bool   `json:"zero_copy"`
	Queues   []int  `json:"queues"`
	// XDPMode is native or generic for rings steered by the XDP program.
	XDPMode string `json:"xdp_mode,omitempty"`

	// Pacing is "hardware" (with the device's range in kbit/s) or
	// "software" (the engine's scheduler).
	Pacing        string `json:"pacing"`
	PacingMinKbps uint32 `json:"pacing_min_kbps,omitempty"`
	PacingMaxKbps uint32 `json:"pacing_max_kbps,omitempty"`
	// DeviceMemory is the staging memory the provider can lend a ring, and
	// DevMemGranted what the rings got (summed), in bytes.
	DeviceMemory  int `json:"device_memory"`
	DevMemGranted int `json:"dev_mem_granted"`

	// PHC is the interface's PTP hardware clock (/dev/ptpN), -1 for none;
	// HWTimestamps the effective timestamp conversion mode of its rings.
	PHC          int    `json:"phc"`
	HWTimestamps string `json:"hw_timestamps"`

	// RDMA holds the RDMA device and port behind the interface, as the
	// verbs provider sees them (nil: none, or not readable by this binary);
	// RDMANote says why verbs is or is not used.
	RDMA     *verbs.DeviceCaps `json:"rdma,omitempty"`
	RDMANote string            `json:"rdma_note,omitempty"`
}
