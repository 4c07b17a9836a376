package stats

import (
	"runtime"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is what one scrape exports: raw counters, never zeroed (a reset
// with bypass-stats -z moves only the stats files' baseline), so every
// _total series only ever grows while the daemon runs.
type Metrics struct {
	Rings   []Ring
	Daemon  DaemonCounters
	Clients []ClientMetrics
	// Requests counts control requests by code name ("OPEN", ...).
	Requests []RequestCount
	// TCs are the traffic-class counters of each ring (eight per ring).
	TCs []TCMetrics
}

// TCMetrics are one traffic class's counters on one ring (ring.TCStats).
type TCMetrics struct {
	Interface string
	Queue, TC int
	// TXBytes are wire bytes; TXBacklog a gauge of bytes queued.
	TXPackets, TXBytes, TXBacklog, TXHeld, RXPackets, RXBytes uint64
}

// ClientMetrics are one client process's totals: every socket it has had,
// closed ones included.
type ClientMetrics struct {
	PID     int
	Command string
	// Started orders clients when there are more than the collector's
	// limit: the earliest keep their own series.
	Started     int64
	Sockets     int
	QueueMemory int64
	Totals      SocketCounters
}

// RequestCount is the control requests of one code and how many failed.
type RequestCount struct {
	Code             string
	Requests, Errors uint64
}

// BuildInfo labels bypassd_build_info.
type BuildInfo struct {
	Version         string
	ProtocolVersion int
}

// DefaultMaxClients is how many clients get their own series by default.
const DefaultMaxClients = 64

// OtherClients is the pid and command label of the series that sums the
// clients beyond the limit.
const OtherClients = "other"

const ns = "bypassd"

type desc struct {
	d     *prometheus.Desc
	gauge bool
}

func counter(name, help string, labels ...string) desc {
	return desc{d: prometheus.NewDesc(ns+"_"+name, help, labels, nil)}
}

func gauge(name, help string, labels ...string) desc {
	return desc{d: prometheus.NewDesc(ns+"_"+name, help, labels, nil), gauge: true}
}

func (d desc) metric(v float64, labels ...string) prometheus.Metric {
	t := prometheus.CounterValue
	if d.gauge {
		t = prometheus.GaugeValue
	}
	return prometheus.MustNewConstMetric(d.d, t, v, labels...)
}

var ringLabels = []string{"interface", "queue"}

// ringSeries maps ring counters to metrics.
var ringSeries = []struct {
	c RingCounter
	d desc
}{
	{RingRXPackets, counter("ring_rx_packets_total", "Datagrams the ring delivered to sockets.", ringLabels...)},
	{RingRXBytes, counter("ring_rx_bytes_total", "Payload bytes the ring delivered to sockets.", ringLabels...)},
	{RingTXPackets, counter("ring_tx_packets_total", "Datagrams the ring sent.", ringLabels...)},
	{RingTXBytes, counter("ring_tx_bytes_total", "Payload bytes the ring sent.", ringLabels...)},
	{RingTXFragments, counter("ring_tx_fragments_total", "IP fragments sent for datagrams larger than the MTU.", ringLabels...)},
	{RingTXBufferWaits, counter("ring_tx_buffer_waits_total", "Times the engine found no free send buffer.", ringLabels...)},
	{RingEngineWakeups, counter("ring_engine_wakeups_total", "Times the ring's engine slept and was woken.", ringLabels...)},
	{RingProviderRXPackets, counter("ring_provider_rx_packets_total", "Frames the queue pair received.", ringLabels...)},
	{RingProviderTXPackets, counter("ring_provider_tx_packets_total", "Frames the queue pair sent.", ringLabels...)},
	{RingProviderRXDropped, counter("ring_provider_rx_dropped_packets_total", "Frames the kernel dropped: RX ring full or no fill buffer.", ringLabels...)},
	{RingFillStarved, counter("ring_fill_starvation_total", "Times the fill ring had no buffer for the device.", ringLabels...)},
	{RingCompletionStarved, counter("ring_completion_starvation_total", "Send buffer allocations that came back short.", ringLabels...)},
	{RingKicks, counter("ring_kicks_total", "System calls made to wake the kernel or the device.", ringLabels...)},
	{RingInvalidDescs, counter("ring_invalid_descriptors_total", "Descriptors the kernel rejected.", ringLabels...)},
	{RingDevMemStagedPackets, counter("ring_dev_mem_staged_packets_total", "Frames sent from device memory (staged).", ringLabels...)},
	{RingDevMemStagedBytes, counter("ring_dev_mem_staged_bytes_total", "Bytes of the frames sent from device memory.", ringLabels...)},
	{RingDevMemInline, counter("ring_dev_mem_inline_packets_total", "Frames at or under the inline threshold, never staged.", ringLabels...)},
	{RingDevMemOOB, counter("ring_dev_mem_oob_packets_total", "Frames over the inline threshold the staging region could not hold, sent from host memory.", ringLabels...)},
	{RingDevMemErrors, counter("ring_dev_mem_errors_total", "Staging faults: completions no staged frame awaited, failed copies.", ringLabels...)},
	{RingPacedQueues, gauge("ring_paced_sockets", "Sockets on the ring paced with SO_MAX_PACING_RATE.", ringLabels...)},
	{RingTXPaced, counter("ring_tx_paced_packets_total", "Datagrams sent from paced sockets.", ringLabels...)},
	{RingTXPaceWaits, counter("ring_tx_pace_waits_total", "Times a paced socket's next datagram waited for its departure time.", ringLabels...)},
	{RingTXPaceLate, counter("ring_tx_pace_late_total", "Paced departures later than the burst allowance could make up for (rate lost).", ringLabels...)},
	{RingTAPActive, gauge("ring_tap_active", "1 while the TAP fallback path carries the ring's flows.", ringLabels...)},
	{RingVFPlugouts, counter("ring_vf_plugouts_total", "Switches of the ring's flows to the TAP path (fast path lost).", ringLabels...)},
	{RingVFPlugins, counter("ring_vf_plugins_total", "Switches of the ring's flows back to the fast path.", ringLabels...)},
	{RingTAPRXPackets, counter("ring_tap_rx_packets_total", "Frames received through the TAP.", ringLabels...)},
	{RingTAPRXBytes, counter("ring_tap_rx_bytes_total", "Bytes of the frames received through the TAP.", ringLabels...)},
	{RingTAPTXPackets, counter("ring_tap_tx_packets_total", "Frames sent through the TAP.", ringLabels...)},
	{RingTAPTXBytes, counter("ring_tap_tx_bytes_total", "Bytes of the frames sent through the TAP.", ringLabels...)},
	{RingTAPTXDropped, counter("ring_tap_tx_dropped_packets_total", "Frames built for a lost fast path, dropped at the switch to the TAP.", ringLabels...)},
	{RingRXHandedOff, counter("ring_handoff_out_packets_total", "Frames the ring received for a flow homed on another ring of the interface and passed to it.", ringLabels...)},
	{RingRXHandoffIn, counter("ring_handoff_in_packets_total", "Frames other rings of the interface passed to this ring.", ringLabels...)},
	{RingTCPRXFrames, counter("tcp_rx_frames_total", "TCP frames handed to the ring's TCP stack.", ringLabels...)},
	{RingTCPRXBytes, counter("tcp_rx_bytes_total", "IP bytes of the TCP frames handed to the ring's TCP stack.", ringLabels...)},
	{RingTCPTXFrames, counter("tcp_tx_frames_total", "TCP frames the ring's stack sent.", ringLabels...)},
	{RingTCPTXBytes, counter("tcp_tx_bytes_total", "IP bytes of the TCP frames the ring's stack sent.", ringLabels...)},
	{RingTCPActiveOpens, counter("tcp_active_opens_total", "TCP connections opened by connect.", ringLabels...)},
	{RingTCPPassiveOpens, counter("tcp_passive_opens_total", "TCP connections opened by a listener.", ringLabels...)},
	{RingTCPEstablished, gauge("tcp_established_connections", "TCP connections in ESTABLISHED or CLOSE-WAIT.", ringLabels...)},
	{RingTCPFailedAttempts, counter("tcp_failed_attempts_total", "TCP connection attempts that failed.", ringLabels...)},
	{RingTCPResetsSent, counter("tcp_resets_sent_total", "TCP segments sent with RST.", ringLabels...)},
	{RingTCPResetsReceived, counter("tcp_resets_received_total", "TCP segments received with RST.", ringLabels...)},
	{RingTCPSegmentsSent, counter("tcp_segments_sent_total", "TCP segments sent, retransmissions included.", ringLabels...)},
	{RingTCPSegmentsReceived, counter("tcp_segments_received_total", "Valid TCP segments received.", ringLabels...)},
	{RingTCPRetransmits, counter("tcp_retransmits_total", "TCP segments retransmitted.", ringLabels...)},
	{RingTCPFastRetransmits, counter("tcp_fast_retransmits_total", "TCP segments retransmitted in fast recovery.", ringLabels...)},
	{RingTCPTimeouts, counter("tcp_timeouts_total", "Expiries of the TCP retransmission timer.", ringLabels...)},
	{RingTCPInvalidSegments, counter("tcp_invalid_segments_total", "TCP segments dropped as invalid: a malformed header (data offset below 5 or past the segment); checksum errors are counted apart.", ringLabels...)},
	{RingTCPChecksumErrors, counter("tcp_checksum_errors_total", "TCP segments with a wrong checksum.", ringLabels...)},
	{RingTCPSynCookies, counter("tcp_syn_cookies_sent_total", "SYN cookies sent because a listener's SYN queue was full.", ringLabels...)},
	{RingTCPListenOverflows, counter("tcp_listen_overflows_total", "SYNs or handshake ACKs dropped because a listener's accept queue was full.", ringLabels...)},
	{RingTCPTSOPackets, counter("tcp_tso_packets_total", "Large TCP segments the stack handed the engine, cut into frames by the engine (software TSO) or the device.", ringLabels...)},
	{RingTCPTSOFrames, counter("tcp_tso_frames_total", "Frames the large TCP segments became.", ringLabels...)},
	{RingTCPTSOHardware, counter("tcp_tso_hw_packets_total", "Large TCP segments the device segmented (hardware TSO).", ringLabels...)},
	{RingTCPDelayedAcks, counter("tcp_delayed_acks_total", "ACKs delayed under the TCP_QUICKACK threshold.", ringLabels...)},
	{RingTCPStackDropped, counter("tcp_stack_dropped_packets_total", "Packets the TCP stack's link dropped: outbound queue full, non-TCP, unparsable.", ringLabels...)},
	{RingRXDecapsulated, counter("ring_vxlan_rx_decapsulated_packets_total", "VXLAN frames of overlay sockets the ring decapsulated.", ringLabels...)},
	{RingTXEncapsulated, counter("ring_vxlan_tx_encapsulated_packets_total", "Datagrams of overlay sockets the ring sent encapsulated in VXLAN.", ringLabels...)},
	{RingFlowsFull, counter("ring_flows_full_total", "Binds and joins refused because the interface's flow steering map was full (raise --max-flows).", ringLabels...)},
}

var (
	ringRXDropped = counter("ring_rx_dropped_packets_total", "Received datagrams the ring dropped, by reason.", "interface", "queue", "reason")
	ringTXDropped = counter("ring_tx_dropped_packets_total", "Datagrams the ring could not send, by reason.", "interface", "queue", "reason")
	ringReasm     = counter("ring_reassembly_datagrams_total", "Fragmented datagrams by reassembly outcome.", "interface", "queue", "result")
	ringInfo      = gauge("ring_info", "A ring: its queue pair's provider and mode.", "interface", "queue", "provider", "mode")
	ringSockets   = gauge("ring_sockets", "Sockets bound on the ring.", ringLabels...)
	ringUMEM      = gauge("ring_umem_bytes", "Size of the ring's buffer pool (UMEM).", ringLabels...)
	ringDevMem    = gauge("ring_dev_mem_alloc_bytes", "Device memory granted to the ring for staging egress frames (0: staging off).", ringLabels...)
	ringStopped   = gauge("ring_engine_stopped", "1 when the ring's engine stopped on an error (see the daemon's log).", ringLabels...)
	ringHWTSMode  = gauge("ring_hw_timestamp_mode", "Effective hardware timestamp conversion mode (0 disable, 1 raw, 3 sync, 4 ptp).", ringLabels...)
	ringHWTSError = gauge("ring_hw_timestamp_error_seconds", "Estimated error of hardware timestamps converted to system time (sync mode only).", ringLabels...)

	rxDropReasons = []struct {
		c      RingCounter
		reason string
	}{{RingRXNoEndpoint, "no_socket"}, {RingRXMalformed, "malformed"}, {RingRXChecksum, "checksum"}, {RingRXQueueFull, "queue_full"},
		{RingRXHandoffDropped, "handoff_full"}}
	txDropReasons = []struct {
		c      RingCounter
		reason string
	}{{RingTXUnreachable, "unreachable"}, {RingTXErrors, "error"}, {RingTXLinkDown, "link_down"}}
	reasmResults = []struct {
		c      RingCounter
		result string
	}{{RingReasmReassembled, "reassembled"}, {RingReasmTimeouts, "timeout"}, {RingReasmEvicted, "evicted"},
		{RingReasmOverlaps, "overlap"}, {RingReasmInvalid, "invalid"}, {RingReasmTooBig, "too_big"}}

	xdpSeries = []struct {
		c RingCounter
		d desc
	}{
		{RingXDPRedirected, counter("xdp_redirected_packets_total", "Frames the XDP program redirected to AF_XDP sockets.", "interface")},
		{RingXDPPassed, counter("xdp_passed_packets_total", "Frames of no offloaded flow, left to the kernel.", "interface")},
		{RingXDPNoSocket, counter("xdp_no_socket_packets_total", "Frames of an offloaded flow whose queue had no socket, left to the kernel.", "interface")},
		{RingXDPFragments, counter("xdp_fragments_total", "IP fragments the XDP program redirected (part of the redirected frames).", "interface")},
		{RingXDPMalformed, counter("xdp_malformed_packets_total", "Frames with truncated or inconsistent headers, left to the kernel.", "interface")},
		{RingXDPOtherQueue, counter("xdp_other_queue_packets_total", "Frames redirected to the socket of the queue that received them rather than their flow's home ring's (handed over in the daemon).", "interface")},
		{RingXDPNoQueueSocket, counter("xdp_no_queue_socket_packets_total", "Frames of an offloaded flow that arrived on a queue no ring serves, left to the kernel.", "interface")},
		{RingRateEntries, gauge("rate_table_entries", "Pacing rate table entries in use.", "interface")},
		{RingRateCapacity, gauge("rate_table_capacity", "Pacing rate table entries.", "interface")},
		{RingRateShared, counter("rate_table_shared_total", "Pacing rates granted by sharing an entry.", "interface")},
		{RingRateNearest, counter("rate_table_nearest_total", "Pacing rates granted as the nearest rate in use of a full table.", "interface")},
	}
	rateRefused = counter("rate_table_refusals_total", "Pacing rates refused, by reason: full (table or paced socket limit) or range.", "interface", "reason")

	clientLabels = []string{"pid", "command"}
	clientSeries = []struct {
		c SocketCounter
		d desc
	}{
		{SockRXPackets, counter("client_rx_packets_total", "Datagrams delivered to the client's sockets.", clientLabels...)},
		{SockRXBytes, counter("client_rx_bytes_total", "Payload bytes delivered to the client's sockets.", clientLabels...)},
		{SockRXDropped, counter("client_rx_dropped_packets_total", "Datagrams dropped because a socket's receive queue was full.", clientLabels...)},
		{SockRXWakeups, counter("client_rx_wakeups_total", "Times the ring woke the client's receiver from sleep.", clientLabels...)},
		{SockTXPackets, counter("client_tx_packets_total", "Datagrams sent from the client's sockets.", clientLabels...)},
		{SockTXBytes, counter("client_tx_bytes_total", "Payload bytes sent from the client's sockets.", clientLabels...)},
		{SockTXWakeups, counter("client_tx_wakeups_total", "Times the ring woke the client's sender waiting for queue room.", clientLabels...)},
		{SockRXQueueBytes, gauge("client_rx_queue_bytes", "Bytes waiting in the client's receive queues.", clientLabels...)},
		{SockTXQueueBytes, gauge("client_tx_queue_bytes", "Bytes waiting in the client's send queues.", clientLabels...)},
	}
	clientTXDropped = counter("client_tx_dropped_packets_total", "Datagrams of the client the ring could not send, by reason.", "pid", "command", "reason")
	clientSockets   = gauge("client_sockets", "Open sockets of the client.", clientLabels...)
	clientQueueMem  = gauge("client_queue_memory_bytes", "Shared memory of the client's socket queues.", clientLabels...)
	clientsGauge    = gauge("clients", "Client processes with a stats file.")
	clientsOther    = gauge("clients_aggregated", "Clients beyond the series limit, summed under pid=\"other\".")

	daemonSeries = []struct {
		c DaemonCounter
		d desc
	}{
		{DaemonSessions, gauge("sessions", "Connected control sessions.")},
		{DaemonSessionsTotal, counter("sessions_total", "Control sessions that said HELLO since the daemon started.")},
		{DaemonSockets, gauge("sockets", "Open sockets of all clients.")},
		{DaemonSocketsTotal, counter("sockets_opened_total", "Sockets opened since the daemon started.")},
		{DaemonMalformed, counter("control_malformed_total", "Control packets refused as malformed.")},
		{DaemonMalformedCloses, counter("control_malformed_closes_total", "Sessions closed after malformed packets in a row.")},
	}
	tcLabels = []string{"interface", "queue", "tc"}
	tcSeries = []struct {
		d desc
		v func(*TCMetrics) uint64
	}{
		{counter("tc_tx_packets_total", "Datagrams the ring sent in the traffic class.", tcLabels...), func(t *TCMetrics) uint64 { return t.TXPackets }},
		{counter("tc_tx_bytes_total", "Wire bytes (headers included) the ring sent in the traffic class.", tcLabels...), func(t *TCMetrics) uint64 { return t.TXBytes }},
		{gauge("tc_tx_backlog_bytes", "Bytes queued in the traffic class's sockets at the engine's last pass.", tcLabels...), func(t *TCMetrics) uint64 { return t.TXBacklog }},
		{counter("tc_tx_held_total", "Engine passes in which the class's rate limit (or the port's) held its datagrams back.", tcLabels...), func(t *TCMetrics) uint64 { return t.TXHeld }},
		{counter("tc_rx_packets_total", "Datagrams received in the traffic class (by the trust state).", tcLabels...), func(t *TCMetrics) uint64 { return t.RXPackets }},
		{counter("tc_rx_bytes_total", "Payload bytes received in the traffic class.", tcLabels...), func(t *TCMetrics) uint64 { return t.RXBytes }},
	}
	ctlRequests = counter("control_requests_total", "Control requests served, by code.", "code")
	ctlErrors   = counter("control_errors_total", "Control requests answered with an error, by code.", "code")
)

// Collector exports a Metrics snapshot taken at each scrape.
type Collector struct {
	source     func() *Metrics
	maxClients int
}

// NewCollector returns a collector reading source at each scrape. At most
// maxClients clients (0: DefaultMaxClients) get series of their own, the
// earliest connected first; the others are summed into one series with
// pid and command "other". That bounds the series count whatever the
// number of clients; the sum series may go down when a client leaves,
// which Prometheus's rate() reads as a counter reset.
func NewCollector(source func() *Metrics, maxClients int) *Collector {
	if maxClients <= 0 {
		maxClients = DefaultMaxClients
	}
	return &Collector{source: source, maxClients: maxClients}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range ringSeries {
		ch <- s.d.d
	}
	for _, d := range []desc{rateRefused, ringRXDropped, ringTXDropped, ringReasm, ringInfo, ringSockets, ringUMEM, ringDevMem, ringStopped, ringHWTSMode, ringHWTSError,
		clientTXDropped, clientSockets, clientQueueMem, clientsGauge, clientsOther, ctlRequests, ctlErrors} {
		ch <- d.d
	}
	for _, s := range xdpSeries {
		ch <- s.d.d
	}
	for _, s := range clientSeries {
		ch <- s.d.d
	}
	for _, s := range daemonSeries {
		ch <- s.d.d
	}
	for _, s := range tcSeries {
		ch <- s.d.d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m := c.source()
	if m == nil {
		return
	}
	seenIface := map[string]bool{}
	for i := range m.Rings {
		r := &m.Rings[i]
		l := []string{r.Interface, strconv.Itoa(r.Queue)}
		for _, s := range ringSeries {
			ch <- s.d.metric(float64(r.Counters[s.c]), l...)
		}
		for _, x := range rxDropReasons {
			ch <- ringRXDropped.metric(float64(r.Counters[x.c]), r.Interface, l[1], x.reason)
		}
		for _, x := range txDropReasons {
			ch <- ringTXDropped.metric(float64(r.Counters[x.c]), r.Interface, l[1], x.reason)
		}
		for _, x := range reasmResults {
			ch <- ringReasm.metric(float64(r.Counters[x.c]), r.Interface, l[1], x.result)
		}
		ch <- ringInfo.metric(1, r.Interface, l[1], r.Provider, r.Mode)
		ch <- ringSockets.metric(float64(r.Sockets), l...)
		ch <- ringUMEM.metric(float64(r.UMEMBytes()), l...)
		ch <- ringDevMem.metric(float64(r.DevMemAlloc), l...)
		stopped := 0.0
		if r.Flags&RingStopped != 0 {
			stopped = 1
		}
		ch <- ringStopped.metric(stopped, l...)
		ch <- ringHWTSMode.metric(float64(r.Counters[RingHWTSMode]), l...)
		if r.Counters[RingHWTSMode] == 3 {
			ch <- ringHWTSError.metric(float64(r.Counters[RingHWTSErrorNs])/1e9, l...)
		}
		// The XDP program is per interface: its rings report the same
		// counters, exported once.
		if !seenIface[r.Interface] {
			seenIface[r.Interface] = true
			for _, s := range xdpSeries {
				ch <- s.d.metric(float64(r.Counters[s.c]), r.Interface)
			}
			ch <- rateRefused.metric(float64(r.Counters[RingRateRefusedFull]), r.Interface, "full")
			ch <- rateRefused.metric(float64(r.Counters[RingRateRefusedRange]), r.Interface, "range")
		}
	}

	for i := range m.TCs {
		t := &m.TCs[i]
		for _, s := range tcSeries {
			ch <- s.d.metric(float64(s.v(t)), t.Interface, strconv.Itoa(t.Queue), strconv.Itoa(t.TC))
		}
	}

	clients := slices.Clone(m.Clients)
	slices.SortFunc(clients, func(a, b ClientMetrics) int {
		if a.Started != b.Started {
			if a.Started < b.Started {
				return -1
			}
			return 1
		}
		return a.PID - b.PID
	})
	var other *ClientMetrics
	aggregated := 0
	for i := range clients {
		cl := &clients[i]
		if i < c.maxClients {
			c.client(ch, cl, strconv.Itoa(cl.PID), cl.Command)
			continue
		}
		if other == nil {
			other = &ClientMetrics{}
		}
		aggregated++
		other.Sockets += cl.Sockets
		other.QueueMemory += cl.QueueMemory
		for j, v := range cl.Totals {
			other.Totals[j] += v
		}
	}
	if other != nil {
		c.client(ch, other, OtherClients, OtherClients)
	}
	ch <- clientsGauge.metric(float64(len(clients)))
	ch <- clientsOther.metric(float64(aggregated))

	for _, s := range daemonSeries {
		ch <- s.d.metric(float64(m.Daemon[s.c]))
	}
	for _, r := range m.Requests {
		ch <- ctlRequests.metric(float64(r.Requests), r.Code)
		ch <- ctlErrors.metric(float64(r.Errors), r.Code)
	}
}

func (c *Collector) client(ch chan<- prometheus.Metric, cl *ClientMetrics, pid, command string) {
	for _, s := range clientSeries {
		ch <- s.d.metric(float64(cl.Totals[s.c]), pid, command)
	}
	ch <- clientTXDropped.metric(float64(cl.Totals[SockTXUnreachable]), pid, command, "unreachable")
	ch <- clientTXDropped.metric(float64(cl.Totals[SockTXErrors]), pid, command, "error")
	ch <- clientSockets.metric(float64(cl.Sockets), pid, command)
	ch <- clientQueueMem.metric(float64(cl.QueueMemory), pid, command)
}

// NewRegistry returns a registry with the collector, bypassd_build_info,
// and the Go runtime and process collectors.
func NewRegistry(c *Collector, info BuildInfo) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	build := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Name: "build_info",
		Help: "Always 1; the labels say which bypassd runs.",
		ConstLabels: prometheus.Labels{"version": info.Version, "goversion": runtime.Version(),
			"protocol_version": strconv.Itoa(info.ProtocolVersion), "stats_version": strconv.Itoa(Version)},
	}, func() float64 { return 1 })
	for _, x := range []prometheus.Collector{c, build, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(x); err != nil {
			return nil, err
		}
	}
	return reg, nil
}
