package stats

import (
	"net/netip"
	"time"
)

// File layout constants (docs/stats-file.md).
const (
	// Magic is the first word of every stats file: the bytes "BPDS".
	Magic = 0x53445042
	// Version is the layout version this package writes and reads. A
	// reader refuses any other version (ErrVersion): fields only move when
	// it changes.
	Version = 2

	// HeaderSize is the size of the file header; the first block follows.
	HeaderSize = 256
	// ClientBlockSize, DaemonBlockSize, RingBlockSize and SocketBlockSize
	// are the sizes of the blocks (unchanged since version 1).
	ClientBlockSize = 256
	DaemonBlockSize = 512
	RingBlockSize   = 1024
	SocketBlockSize = 512

	// MaxGroups is how many multicast memberships a socket block lists;
	// Socket.GroupCount tells how many the socket really has.
	MaxGroups = 8
	// MaxSocketSlots bounds the socket blocks of one client file; a client
	// with more sockets has the first MaxSocketSlots (by id) published and
	// Header.SocketsTotal says how many it has.
	MaxSocketSlots = 65536
	// MaxRingSlots bounds the ring blocks of the daemon file.
	MaxRingSlots = 1024
)

// Offsets in the header. Bytes 0..127 are written once when the file is
// created (magic last); bytes 128..255 are rewritten by every publication
// under the sequence counter.
const (
	offMagic        = 0
	offVersion      = 4
	offHeaderSize   = 8
	offKind         = 12
	offFileSize     = 16
	offWriterPID    = 24
	offPID          = 28
	offUID          = 32
	offStarted      = 40
	offSummaryOff   = 48
	offSummarySize  = 52
	offRingOff      = 56
	offRingSize     = 60
	offRingSlots    = 64
	offSocketOff    = 68
	offSocketSize   = 72
	offSocketSlots  = 76
	offCommand      = 80
	lenCommand      = 16
	offProgram      = 96
	lenProgram      = 32
	offSeq          = 128
	offUpdated      = 136
	offInterval     = 144
	offResets       = 152
	offResetTime    = 160
	offRingsUsed    = 168
	offSocketsUsed  = 172
	offSocketsTotal = 176
	dynamicStart    = 128
)

// Kind says whose file it is.
type Kind uint32

// File kinds.
const (
	KindClient Kind = 1 // a client process: summary = Client, socket blocks
	KindDaemon Kind = 2 // the daemon itself: summary = Daemon, ring blocks
)

func (k Kind) String() string {
	switch k {
	case KindClient:
		return "client"
	case KindDaemon:
		return "daemon"
	}
	return "unknown"
}

// Header is a stats file's header.
type Header struct {
	Kind Kind
	// WriterPID is the daemon that writes the file; PID the process it
	// describes (the daemon itself for KindDaemon) and UID its user.
	WriterPID, PID int
	UID            uint32
	// Command is the process name from /proc/PID/comm (at most 15 bytes);
	// Program the name the client gave in HELLO (at most 32 bytes).
	Command, Program string
	// Started is when the client connected (the daemon: started).
	Started time.Time

	// The rest changes with every publication.

	// Generation counts publications.
	Generation uint64
	// Updated is when the snapshot was taken; Interval how often the
	// writer publishes.
	Updated  time.Time
	Interval time.Duration
	// Resets counts how often the counters were zeroed (bypass-stats -z);
	// ResetTime is the last time.
	Resets    uint64
	ResetTime time.Time
	// RingSlots and SocketSlots are the file's block capacity.
	RingSlots, SocketSlots int
	// SocketsTotal is how many sockets the client had (may exceed
	// SocketSlots; only that many are listed).
	SocketsTotal int
}

// SocketFlags describe a socket's state.
type SocketFlags uint32

// Socket flags.
const (
	SocketBound         SocketFlags = 1 << 0 // Local is valid
	SocketConnected     SocketFlags = 1 << 1 // Peer is valid
	SocketMulticastLoop SocketFlags = 1 << 2 // IP_MULTICAST_LOOP on
	SocketReuseAddr     SocketFlags = 1 << 3 // SO_REUSEADDR
	SocketBroken        SocketFlags = 1 << 4 // its queues failed; the ring no longer serves it
)

// SocketCounter indexes SocketCounters.
type SocketCounter int

// Socket counters, in block order. Gauges (marked) are values at the
// snapshot and are not zeroed by a reset.
const (
	SockRXPackets       SocketCounter = iota // datagrams delivered into the RX queue
	SockRXBytes                              // their payload bytes
	SockRXDropped                            // datagrams dropped: RX queue full
	SockRXBatches                            // times the engine published datagrams to the RX queue
	SockRXWakeups                            // of those, times the application slept and was woken (poll miss)
	SockRXQueueBytes                         // gauge: bytes waiting in the RX queue
	SockRXQueueMaxBytes                      // gauge: highest RX queue bytes seen at a snapshot since the last reset
	SockRXKernelPackets                      // datagrams that took the kernel path (0 with afxdp)
	SockRXKernelBytes                        // their payload bytes
	SockTXPackets                            // datagrams sent from the TX queue
	SockTXBytes                              // their payload bytes
	SockTXUnreachable                        // datagrams dropped: next hop unresolvable
	SockTXErrors                             // datagrams dropped: could not be encoded or sent
	SockTXWakeups                            // times the application waited for TX room and was woken (would-block)
	SockTXQueueBytes                         // gauge: bytes waiting in the TX queue
	SockTXQueueMaxBytes                      // gauge: highest TX queue bytes seen at a snapshot since the last reset
	SockTXKernelPackets                      // datagrams sent through the kernel path (0 with afxdp)
	SockTXKernelBytes                        // their payload bytes
	NumSocketCounters                        // number of socket counters in this version
)

// socketCounterCap is how many counters a socket block has room for.
const socketCounterCap = 24

// SocketCounters are one socket's counters (or a client's totals).
type SocketCounters [NumSocketCounters]uint64

// SocketActivity is a socket's datagrams both ways, drops included (a
// socket that only drops is busy too), from its counters as get reads
// them (totals or rates).
func SocketActivity(get func(SocketCounter) uint64) uint64 {
	return get(SockRXPackets) + get(SockTXPackets) + get(SockRXDropped) + get(SockTXErrors) + get(SockTXUnreachable)
}

var socketCounterNames = [NumSocketCounters]string{
	"rx_packets", "rx_bytes", "rx_dropped", "rx_batches", "rx_wakeups", "rx_queue_bytes", "rx_queue_max_bytes",
	"rx_kernel_packets", "rx_kernel_bytes",
	"tx_packets", "tx_bytes", "tx_unreachable", "tx_errors", "tx_wakeups", "tx_queue_bytes", "tx_queue_max_bytes",
	"tx_kernel_packets", "tx_kernel_bytes",
}

func (c SocketCounter) String() string {
	if c >= 0 && c < NumSocketCounters {
		return socketCounterNames[c]
	}
	return "unknown"
}

// IsGauge reports whether c is a value at the snapshot rather than a count.
func (c SocketCounter) IsGauge() bool {
	switch c {
	case SockRXQueueBytes, SockRXQueueMaxBytes, SockTXQueueBytes, SockTXQueueMaxBytes:
		return true
	}
	return false
}

// Membership is one multicast membership of a socket; Source is the zero
// Addr for an any-source membership.
type Membership struct {
	Group, Source netip.Addr
}

// Socket is one socket block.
type Socket struct {
	ID    uint32
	Flags SocketFlags
	// Family is unix.AF_INET (2) or unix.AF_INET6 (10).
	Family uint16
	// Ring is the index of the ring the socket uses (the daemon file's
	// ring blocks), -1 when it has none.
	Ring int
	// Header options of transmitted datagrams.
	TTL, MulticastTTL, TOS uint8
	// Local is valid when SocketBound is set, Peer when SocketConnected.
	Local, Peer netip.AddrPort
	// QueueBytes is the capacity of each of its queues.
	QueueBytes uint32
	// Groups lists up to MaxGroups memberships; GroupCount is how many
	// the socket has.
	Groups     []Membership
	GroupCount int
	Counters   SocketCounters
}

// Client is the summary block of a client file.
type Client struct {
	// Sockets is how many sockets the client has open; MaxSockets its
	// limit; SocketsOpened how many it has opened since it connected.
	Sockets, MaxSockets int
	SocketsOpened       uint64
	// QueueMemory is the shared memory of its sockets' queues, and
	// QueueMemoryLimit the most it may use, in bytes.
	QueueMemory, QueueMemoryLimit int64
	// Totals sums the counters of every socket the client has had, closed
	// ones included (gauges: of the open ones).
	Totals SocketCounters
}

// clientCounterOff is where Client.Totals starts in the client block.
const clientCounterOff = 64

// RingFlags describe a ring's state.
type RingFlags uint32

// Ring flags.
const (
	RingZeroCopy RingFlags = 1 << 0 // the NIC reads and writes the buffers directly
	RingStopped  RingFlags = 1 << 1 // the engine stopped on an error (see the daemon's log)
)

// RingCounter indexes RingCounters.
type RingCounter int

// Ring counters, in block order.
const (
	RingRXPackets           RingCounter = iota // datagrams delivered to sockets (offloaded RX)
	RingRXBytes                                // their payload bytes
	RingTXPackets                              // datagrams sent (offloaded TX)
	RingTXBytes                                // their payload bytes
	RingRXNoEndpoint                           // datagrams steered here with no socket to take them
	RingRXMalformed                            // frames that failed to parse
	RingRXChecksum                             // datagrams with a wrong UDP checksum
	RingRXQueueFull                            // datagrams dropped: a socket's RX queue was full
	RingTXFragments                            // IP fragments sent for datagrams over the MTU
	RingTXBufferWaits                          // times the engine found no free send buffer
	RingTXUnreachable                          // datagrams dropped: next hop unresolvable
	RingTXErrors                               // datagrams dropped: could not be encoded
	RingTXLinkDown                             // frames dropped: link down
	RingEngineWakeups                          // times the engine slept and woke up
	RingProviderRXPackets                      // frames the provider received
	RingProviderTXPackets                      // frames the provider sent
	RingProviderRXDropped                      // frames the kernel dropped: RX ring full or no fill buffer
	RingFillStarved                            // times the fill ring had no buffer for the device (fill starvation)
	RingCompletionStarved                      // buffer allocations short of frames (completion starvation)
	RingKicks                                  // system calls made to wake the kernel or device
	RingInvalidDescs                           // descriptors the kernel rejected
	RingReasmReassembled                       // datagrams reassembled from fragments
	RingReasmTimeouts                          // incomplete datagrams dropped after the timeout
	RingReasmEvicted                           // incomplete datagrams dropped to stay within the memory bound
	RingReasmOverlaps                          // datagrams dropped for overlapping fragments
	RingReasmInvalid                           // malformed fragments and inconsistent datagrams
	RingReasmTooBig                            // datagrams dropped for exceeding the IP size limit
	RingXDPRedirected                          // XDP: frames redirected to AF_XDP sockets (interface-wide)
	RingXDPPassed                              // XDP: frames of no offloaded flow, left to the kernel
	RingXDPNoSocket                            // XDP: frames of a flow whose queue has no socket, left to the kernel
	RingXDPFragments                           // XDP: IP fragments redirected (part of redirected)
	RingXDPMalformed                           // XDP: truncated or inconsistent headers, left to the kernel
	RingDevMemStagedPackets                    // frames sent from device memory (staged)
	RingDevMemStagedBytes                      // their bytes (whole frames)
	RingDevMemInline                           // frames at or under the inline threshold, never staged
	RingDevMemOOB                              // frames over the threshold the staging region could not hold (sent from host memory)
	RingDevMemErrors                           // staging faults: completions no staged frame awaited, failed copies
	RingHWTSMode                               // gauge: effective hardware timestamp conversion mode, 0..4
	RingHWTSErrorNs                            // gauge: estimated error of converted hardware timestamps in ns (sync mode; else 0)
	RingPacedQueues                            // gauge: paced sockets on the ring
	RingTXPaced                                // datagrams sent from paced sockets
	RingTXPaceWaits                            // times a paced socket's next datagram waited for its departure time
	RingTXPaceLate                             // departures later than the burst allowance makes up for (rate lost)
	RingRateEntries                            // gauge: rate table entries in use (interface-wide)
	RingRateCapacity                           // gauge: rate table entries (interface-wide)
	RingRateShared                             // rates granted by sharing an entry (interface-wide)
	RingRateNearest                            // rates granted as the nearest rate of a full table (interface-wide)
	RingRateRefusedFull                        // rates refused: table full or paced socket limit (interface-wide)
	RingRateRefusedRange                       // rates refused: outside the interface's range (interface-wide)
	RingTAPFallback                            // gauge: fallback mode (0 none, 1 auto, 2 tap)
	RingTAPActive                              // gauge: 1 while the TAP path carries the ring's flows
	RingVFPlugouts                             // switches of the flows to the TAP path (fast path lost)
	RingVFPlugins                              // switches back to the fast path
	RingTAPFD                                  // gauge: the TAP's file descriptor in bypassd (0: no TAP)
	RingTAPIfindex                             // gauge: the TAP device's ifindex (0: no TAP)
	RingTAPRXPackets                           // frames received through the TAP
	RingTAPRXBytes                             // their bytes (whole frames)
	RingTAPTXPackets                           // frames sent through the TAP
	RingTAPTXBytes                             // their bytes (whole frames)
	RingTAPTXDropped                           // frames built for a lost fast path, dropped at the switch
	RingRXHandedOff                            // frames received for a flow homed on another ring, passed to it
	RingRXHandoffIn                            // frames other rings of the interface passed to this one
	RingRXHandoffDropped                       // frames for another ring dropped: its inbox full, or no ring there
	RingXDPOtherQueue                          // XDP: frames redirected to the socket of the queue that received them, not their home's (interface-wide)
	RingXDPNoQueueSocket                       // XDP: frames of an offloaded flow on a queue no ring serves, left to the kernel (interface-wide)
	RingTCPRXFrames                            // TCP frames handed to the ring's TCP stack
	RingTCPRXBytes                             // their IP bytes
	RingTCPTXFrames                            // TCP frames the stack sent
	RingTCPTXBytes                             // their IP bytes
	RingTCPActiveOpens                         // TCP connections opened by connect
	RingTCPPassiveOpens                        // TCP connections opened by a listener
	RingTCPEstablished                         // gauge: TCP connections in ESTABLISHED or CLOSE-WAIT
	RingTCPFailedAttempts                      // TCP connection attempts that failed
	RingTCPResetsSent                          // TCP segments sent with RST
	RingTCPResetsReceived                      // TCP segments received with RST
	RingTCPSegmentsSent                        // TCP segments sent (retransmissions included)
	RingTCPSegmentsReceived                    // valid TCP segments received
	RingTCPRetransmits                         // TCP segments retransmitted
	RingTCPFastRetransmits                     // TCP segments retransmitted in fast recovery
	RingTCPTimeouts                            // TCP retransmission timer expiries
	RingTCPInvalidSegments                     // TCP segments dropped as invalid
	RingTCPChecksumErrors                      // TCP segments dropped for a wrong checksum (not part of invalid)
	RingTCPSynCookies                          // SYN cookies sent: a listener's SYN queue was full
	RingTCPListenOverflows                     // SYNs or handshake ACKs dropped: a listener's accept queue was full
	RingTCPStackDropped                        // packets the TCP stack's link dropped: its queue full, or not IP/TCP
	RingRXDecapsulated                         // VXLAN frames of overlay sockets decapsulated
	RingTXEncapsulated                         // datagrams of overlay sockets sent encapsulated in VXLAN
	RingFlowsFull                              // binds and joins refused because the interface's flow steering map was full (--max-flows)
	RingTCPTSOPackets                          // large TCP segments from the stack, cut into frames by the engine or the device
	RingTCPTSOFrames                           // the frames they became
	RingTCPTSOHardware                         // those the device segmented (hardware TSO)
	RingTCPDelayedAcks                         // ACKs delayed under the TCP_QUICKACK threshold
	NumRingCounters                            // number of ring counters in this version
)

// ringCounterOff is where the counters start in a ring block, and
// ringCounterCap how many it has room for.
const (
	ringCounterOff = 128
	ringCounterCap = (RingBlockSize - ringCounterOff) / 8
)

// IsGauge reports whether c is a value at the snapshot rather than a count.
func (c RingCounter) IsGauge() bool {
	switch c {
	case RingHWTSMode, RingHWTSErrorNs, RingPacedQueues, RingRateEntries, RingRateCapacity,
		RingTAPFallback, RingTAPActive, RingTAPFD, RingTAPIfindex, RingTCPEstablished:
		return true
	}
	return false
}

// RingCounters are one ring's counters.
type RingCounters [NumRingCounters]uint64

var ringCounterNames = [NumRingCounters]string{
	"rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "rx_no_endpoint", "rx_malformed", "rx_checksum",
	"rx_queue_full", "tx_fragments", "tx_buffer_waits", "tx_unreachable", "tx_errors", "tx_link_down",
	"engine_wakeups", "provider_rx_packets", "provider_tx_packets", "provider_rx_dropped", "fill_starved",
	"completion_starved", "kicks", "invalid_descs", "reasm_reassembled", "reasm_timeouts", "reasm_evicted",
	"reasm_overlaps", "reasm_invalid", "reasm_too_big", "xdp_redirected", "xdp_passed", "xdp_no_socket",
	"xdp_fragments", "xdp_malformed", "dev_mem_staged_packets", "dev_mem_staged_bytes", "dev_mem_inline",
	"dev_mem_oob", "dev_mem_errors", "hw_ts_mode", "hw_ts_error_ns",
	"paced_queues", "tx_paced", "tx_pace_waits", "tx_pace_late",
	"rate_entries", "rate_capacity", "rate_shared", "rate_nearest", "rate_refused_full", "rate_refused_range",
	"tap_fallback", "tap_active", "vf_plugouts", "vf_plugins", "tap_fd", "tap_ifindex",
	"tap_rx_packets", "tap_rx_bytes", "tap_tx_packets", "tap_tx_bytes", "tap_tx_dropped",
	"rx_handed_off", "rx_handoff_in", "rx_handoff_dropped", "xdp_other_queue", "xdp_no_queue_socket",
	"tcp_rx_frames", "tcp_rx_bytes", "tcp_tx_frames", "tcp_tx_bytes", "tcp_active_opens", "tcp_passive_opens",
	"tcp_established", "tcp_failed_attempts", "tcp_resets_sent", "tcp_resets_received", "tcp_segments_sent",
	"tcp_segments_received", "tcp_retransmits", "tcp_fast_retransmits", "tcp_timeouts", "tcp_invalid_segments",
	"tcp_checksum_errors", "tcp_syn_cookies", "tcp_listen_overflows", "tcp_stack_dropped",
	"rx_decapsulated", "tx_encapsulated",
	"flows_full",
	"tcp_tso_packets", "tcp_tso_frames", "tcp_tso_hw_packets", "tcp_delayed_acks",
}

func (c RingCounter) String() string {
	if c >= 0 && c < NumRingCounters {
		return ringCounterNames[c]
	}
	return "unknown"
}

// Ring is one ring block.
type Ring struct {
	// Index is the ring's position in the daemon's configuration.
	Index     int
	Interface string
	Queue     int
	Ifindex   int
	Flags     RingFlags
	// Provider ("afxdp") and Mode ("native/copy") describe the queue pair.
	Provider, Mode string
	// RXFrames, TXFrames and FrameSize describe the buffer pool (UMEM).
	RXFrames, TXFrames, FrameSize int
	// Sockets is how many sockets are bound on the ring.
	Sockets int
	// DevMemAlloc is the device memory the ring was granted for staging
	// egress frames, in bytes (0: staging off).
	DevMemAlloc int64
	Counters    RingCounters
}

// UMEMBytes is the size of the ring's buffer pool.
func (r *Ring) UMEMBytes() int64 { return int64(r.RXFrames+r.TXFrames) * int64(r.FrameSize) }

// DaemonCounter indexes DaemonCounters.
type DaemonCounter int

// Daemon counters, in block order.
const (
	DaemonSessions        DaemonCounter = iota // gauge: connected clients
	DaemonSessionsTotal                        // clients that connected since start
	DaemonSockets                              // gauge: open sockets of all clients
	DaemonSocketsTotal                         // sockets opened since start
	DaemonRequests                             // control requests served
	DaemonRequestErrors                        // control requests answered with an error
	DaemonMalformed                            // control packets refused as malformed
	DaemonMalformedCloses                      // sessions closed for malformed packets
	DaemonStatsFiles                           // gauge: client stats files published
	NumDaemonCounters                          // number of daemon counters in this version
)

// daemonCounterOff is where the counters start in the daemon block, and
// daemonCounterCap how many it has room for.
const (
	daemonCounterOff = 256
	daemonCounterCap = (DaemonBlockSize - daemonCounterOff) / 8
)

// DaemonCounters are the daemon's control-plane counters.
type DaemonCounters [NumDaemonCounters]uint64

var daemonCounterNames = [NumDaemonCounters]string{
	"sessions", "sessions_total", "sockets", "sockets_total", "requests", "request_errors", "malformed",
	"malformed_closes", "stats_files",
}

func (c DaemonCounter) String() string {
	if c >= 0 && c < NumDaemonCounters {
		return daemonCounterNames[c]
	}
	return "unknown"
}

// IsGauge reports whether c is a value at the snapshot.
func (c DaemonCounter) IsGauge() bool {
	return c == DaemonSessions || c == DaemonSockets || c == DaemonStatsFiles
}

// Daemon is the summary block of the daemon's file.
type Daemon struct {
	// LogLevel is the zap level (-1 debug, 0 info, 1 warn, 2 error).
	LogLevel int8
	// MaxSockets and QueueBytes are the per-client socket limit and the
	// default queue size.
	MaxSockets, QueueBytes int
	// Version is the daemon's version string; SocketPath its control
	// socket (where bypass-stats sends -z and -l).
	Version, SocketPath string
	Counters            DaemonCounters
}

// Daemon block offsets.
const (
	offDLogLevel   = 0
	offDMaxSockets = 4
	offDQueueBytes = 8
	offDVersion    = 16
	lenDVersion    = 48
	offDSocketPath = 64
	lenDSocketPath = 112
)

// Snapshot is everything a stats file holds at one publication.
type Snapshot struct {
	Header Header
	// Client is set in client files, Daemon in the daemon's.
	Client *Client
	Daemon *Daemon
	// Rings (daemon file) and Sockets (client files) in block order.
	Rings   []Ring
	Sockets []Socket
}

// The counter enums must fit their blocks: these fail to compile (negative
// array length) when one outgrows its room; then bump Version and the sizes.
var (
	_ [socketCounterCap - int(NumSocketCounters)]struct{}
	_ [ringCounterCap - int(NumRingCounters)]struct{}
	_ [daemonCounterCap - int(NumDaemonCounters)]struct{}
	_ [ClientBlockSize - clientCounterOff - 8*int(NumSocketCounters)]struct{}
)
