package ctldoc

import (
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

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

// QoSToWire is the SET_QOS body that sets iface to c.
func QoSToWire(iface string, c *qos.Config) ctlproto.SetQoS {
	m := ctlproto.SetQoS{Interface: iface, BW: c.BW, PrioTC: c.PrioTC, SkPrioUP: c.SkPrioUP, DSCP2Prio: c.DSCP2Prio,
		Trust: uint8(c.Trust), TTL: c.TTL, TrafficClass: int16(c.TrafficClass), RateKbps: c.RateKbps, MaxRateKbps: c.MaxRateKbps}
	for tc, t := range c.TSA {
		m.TSA[tc] = uint8(t)
	}
	return m
}

// QoSFromWire is the state a SET_QOS body asks for (not yet validated).
func QoSFromWire(m *ctlproto.SetQoS) qos.Config {
	c := qos.Config{BW: m.BW, PrioTC: m.PrioTC, SkPrioUP: m.SkPrioUP, DSCP2Prio: m.DSCP2Prio,
		Trust: qos.Trust(m.Trust), TTL: m.TTL, TrafficClass: int(m.TrafficClass), RateKbps: m.RateKbps, MaxRateKbps: m.MaxRateKbps}
	for tc, t := range m.TSA {
		c.TSA[tc] = qos.TSA(t)
	}
	return c
}
