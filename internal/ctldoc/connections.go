package ctldoc

// TopicConnections is the QUERY topic of the rings' TCP connections
// (bypassctl connections).
const TopicConnections = "connections"

// ConnectionsDoc answers TopicConnections: every TCP connection of every
// ring's stack (listeners are in TopicFlows), those of other users' clients
// and those no client holds (closing, or not accepted yet) only for root
// and the daemon's user.
type ConnectionsDoc struct {
	Connections []ConnectionDoc `json:"connections"`
}

// ConnectionDoc is one TCP connection.
type ConnectionDoc struct {
	// Ring is the index of the ring whose stack holds it (RingDoc.Index).
	Ring      int    `json:"ring"`
	Interface string `json:"interface"`
	Queue     int    `json:"queue"`
	Local     string `json:"local"`
	Remote    string `json:"remote"`
	// State is the TCP state: "ESTABLISHED", "SYN-SENT", "CLOSE-WAIT", ...
	State string `json:"state"`
	// PID and Socket are the client process and socket id holding the
	// connection (0: none: the connection is closing after its socket
	// closed, or waits in a listener's accept queue).
	PID    int32  `json:"pid,omitempty"`
	Socket uint32 `json:"socket,omitempty"`
	// RTTMicros and RTTVarMicros are the smoothed round-trip time and its
	// variation, RTOMillis the retransmission timeout.
	RTTMicros    int64 `json:"rtt_us"`
	RTTVarMicros int64 `json:"rttvar_us"`
	RTOMillis    int64 `json:"rto_ms"`
	// Cwnd and Ssthresh are the congestion window and slow-start
	// threshold in segments.
	Cwnd     uint32 `json:"cwnd"`
	Ssthresh uint32 `json:"ssthresh"`
	// Retransmits are segments sent again, Timeouts retransmission timer
	// expiries; SegmentsOut and SegmentsIn every segment.
	Retransmits uint64 `json:"retransmits"`
	Timeouts    uint64 `json:"timeouts"`
	SegmentsOut uint64 `json:"segments_out"`
	SegmentsIn  uint64 `json:"segments_in"`
	// BytesIn went from the stack to the client, BytesOut from the client
	// into the stack (0 for connections no client holds).
	BytesIn  uint64 `json:"bytes_in"`
	BytesOut uint64 `json:"bytes_out"`
	// SendQueued and RecvQueued are bytes in the stack's send and receive
	// buffers.
	SendQueued int `json:"send_queued"`
	RecvQueued int `json:"recv_queued"`
	// PumpWakeups counts the times the daemon's goroutine serving the
	// connection slept and woke up (0 for connections no client holds).
	PumpWakeups uint64 `json:"pump_wakeups"`
}
