package ctldoc

import "github.com/bypassd/bypassd/ring/sched/qos"

// TopicQoS is answered with QoSDoc: each interface's traffic-class state
// and counters (bypassctl qos).
const TopicQoS = "qos"

// QoSDoc answers TopicQoS.
type QoSDoc struct {
	Interfaces []QoSInterface `json:"interfaces"`
}

// QoSInterface is one interface: its QoS state (the keys of the daemon's
// QoS file) and per-class counters summed over its rings.
type QoSInterface struct {
	Interface string                 `json:"interface"`
	Rings     int                    `json:"rings"`
	Config    qos.Config             `json:"config"`
	TC        [qos.NumTC]QoSCounters `json:"tc"`
}

// QoSCounters are one traffic class's counters (ring.TCStats).
type QoSCounters struct {
	TXPackets uint64 `json:"tx_packets"`
	TXBytes   uint64 `json:"tx_bytes"`
	TXBacklog uint64 `json:"tx_backlog_bytes"`
	TXHeld    uint64 `json:"tx_held"`
	RXPackets uint64 `json:"rx_packets"`
	RXBytes   uint64 `json:"rx_bytes"`
}
