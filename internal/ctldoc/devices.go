package ctldoc

import "github.com/bypassd/bypassd/ring/provider/verbs"

// TopicDevices is the devices topic: what each served interface's NIC
// offers and how the daemon uses it (bypassctl devices).
const TopicDevices = "devices"

// DevicesDoc answers TopicDevices.
type DevicesDoc struct {
	Devices []DeviceDoc `json:"devices"`
	// Limits are the daemon process's own limits that bound how many
	// sockets it can serve.
	Limits Limits `json:"limits"`
}

// Limits are the daemon's RLIMIT_NOFILE soft and hard limits (the soft
// one raised to the hard one at start).
type Limits struct {
	NofileSoft uint64 `json:"nofile_soft"`
	NofileHard uint64 `json:"nofile_hard"`
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
	// RSS is how a frame that RSS put on a queue other than its flow's
	// home ring's reaches that ring: "handoff" (the ring of the receiving
	// queue passes it on inside the daemon), "single queue" (the interface
	// has one), or "none" (one ring on a multi-queue interface: frames on
	// the other queues go to the kernel).
	RSS string `json:"rss"`
	// Ntuple reports whether the NIC takes n-tuple flow rules (which
	// would put each flow on its home queue; the daemon does not install
	// them yet); NtupleNote why not, when not.
	Ntuple     bool   `json:"ntuple"`
	NtupleNote string `json:"ntuple_note,omitempty"`
	// MTU is the interface MTU the rings serve; FrameSize their buffer
	// size; MaxFrame the largest frame they carry; MultiBuffer whether
	// frames larger than a buffer travel as descriptor chains.
	MTU         int  `json:"mtu"`
	FrameSize   int  `json:"frame_size"`
	MaxFrame    int  `json:"max_frame"`
	MultiBuffer bool `json:"multi_buffer"`

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
