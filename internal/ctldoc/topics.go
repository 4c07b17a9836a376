// Package ctldoc holds the JSON documents the daemon answers QUERY with
// (docs/protocol.md, "QUERY"): one type per topic, shared by the daemon that
// writes them and bypassctl that renders them.
//
// It is kept apart from internal/ctlproto, the wire codec every client
// links, so that application binaries do not carry the operator's document
// types (nor what they embed, such as the verbs device facts).
package ctldoc

// Topics every daemon of this version answers. Features add their own
// (TopicRates, TopicDevices); TopicTopics lists what a daemon knows.
const (
	TopicTopics   = "topics"
	TopicRings    = "rings"
	TopicSessions = "sessions"
	TopicFlows    = "flows"
)

// The documents of the topics every daemon answers. Field names are the
// JSON keys (snake case, stable within a protocol version; new keys may be
// added, clients ignore keys they do not know).

// TopicsDoc answers TopicTopics.
type TopicsDoc struct {
	Topics []string `json:"topics"`
}

// RingsDoc answers TopicRings.
type RingsDoc struct {
	Rings []RingDoc `json:"rings"`
}

// RingDoc is one ring.
type RingDoc struct {
	Index     int    `json:"index"`
	Interface string `json:"interface"`
	Queue     int    `json:"queue"`
	Ifindex   int    `json:"ifindex"`
	Provider  string `json:"provider"`
	Mode      string `json:"mode"`
	ZeroCopy  bool   `json:"zero_copy"`
	// XDPMode is "native" or "generic" for providers steered by the XDP
	// program, empty otherwise; XDPFallback says why native was refused.
	XDPMode     string `json:"xdp_mode,omitempty"`
	XDPFallback string `json:"xdp_fallback,omitempty"`
	FrameSize   int    `json:"frame_size"`
	RXFrames    int    `json:"rx_frames"`
	TXFrames    int    `json:"tx_frames"`
	Sockets     int    `json:"sockets"`
	// State is "running", or "stopped: <error>".
	State     string `json:"state"`
	RXPackets uint64 `json:"rx_packets"`
	TXPackets uint64 `json:"tx_packets"`
	// CPUs are the CPUs the ring's engine thread is pinned to (empty: not
	// pinned).
	CPUs []int `json:"cpus"`
	// HandedOff counts frames the ring passed to the home rings of their
	// flows, HandoffIn frames other rings passed to it, HandoffDropped
	// frames it could not pass (the home ring's inbox full).
	HandedOff      uint64 `json:"handed_off"`
	HandoffIn      uint64 `json:"handoff_in"`
	HandoffDropped uint64 `json:"handoff_dropped"`
}

// SessionsDoc answers TopicSessions: the client sessions the caller may
// see (all for root and the daemon's user, its own uid's otherwise).
type SessionsDoc struct {
	Sessions []SessionDoc `json:"sessions"`
}

// SessionDoc is one client session.
type SessionDoc struct {
	PID     int32       `json:"pid"`
	UID     uint32      `json:"uid"`
	GID     uint32      `json:"gid"`
	Program string      `json:"program"`
	Sockets []SocketDoc `json:"sockets"`
}

// SocketDoc is one socket of a session.
type SocketDoc struct {
	ID     uint32 `json:"id"`
	Family string `json:"family"` // "inet" or "inet6"
	// Ring is the index of the socket's ring (RingDoc.Index).
	Ring int `json:"ring"`
	// Local and Peer are empty while unbound / unconnected.
	Local     string `json:"local,omitempty"`
	Peer      string `json:"peer,omitempty"`
	Broken    bool   `json:"broken,omitempty"`
	RXPackets uint64 `json:"rx_packets"`
	TXPackets uint64 `json:"tx_packets"`
}

// FlowsDoc answers TopicFlows: the steering entries installed per
// interface (what the XDP program's flow map holds).
type FlowsDoc struct {
	Flows []FlowDoc `json:"flows"`
}

// FlowDoc is one steering entry.
type FlowDoc struct {
	Interface string `json:"interface"`
	Proto     string `json:"proto"`
	Dst       string `json:"dst"`
	// Src is empty for a 3-tuple flow (any source).
	Src   string `json:"src,omitempty"`
	Queue uint32 `json:"queue"`
	// VNI and VXLANPort are set for a flow inside a VXLAN overlay (Dst
	// and Src are then the inner datagram's).
	VNI       uint32 `json:"vni,omitempty"`
	VXLANPort uint16 `json:"vxlan_port,omitempty"`
}
