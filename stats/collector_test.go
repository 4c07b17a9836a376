package stats

import (
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

func gather(t *testing.T, m *Metrics, maxClients int) map[string]*dto.MetricFamily {
	t.Helper()
	reg, err := NewRegistry(NewCollector(func() *Metrics { return m }, maxClients), BuildInfo{Version: "v9", ProtocolVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestCollector(t *testing.T) {
	ring := func(iface string, q int, rx uint64) Ring {
		r := Ring{Interface: iface, Queue: q, Provider: "afxdp", Mode: "native/copy", RXFrames: 10, TXFrames: 6, FrameSize: 2048, Sockets: 2}
		r.Counters[RingRXPackets] = rx
		r.Counters[RingRXChecksum] = 3
		r.Counters[RingXDPRedirected] = 1000
		r.DevMemAlloc = 64 << 10
		r.Counters[RingDevMemOOB] = 4
		return r
	}
	synced := ring("eth2", 0, 11)
	synced.Counters[RingHWTSMode] = 3
	synced.Counters[RingHWTSErrorNs] = 250
	m := &Metrics{
		Rings: []Ring{ring("eth1", 0, 5), ring("eth1", 1, 7), synced},
		Requests: []RequestCount{
			{Code: "OPEN", Requests: 4, Errors: 1}, {Code: "BIND", Requests: 3},
		},
	}
	m.TCs = []TCMetrics{{Interface: "eth1", Queue: 1, TC: 5, TXPackets: 8, TXBytes: 8000, TXBacklog: 100, TXHeld: 2, RXPackets: 3, RXBytes: 300}}
	m.Daemon[DaemonSessions] = 3
	m.Daemon[DaemonSocketsTotal] = 9
	for i, pid := range []int{30, 10, 20} { // started in this order: 30 first
		c := ClientMetrics{PID: pid, Command: "app" + string(rune('a'+i)), Started: int64(i), Sockets: 1, QueueMemory: 100}
		c.Totals[SockRXPackets] = uint64(pid)
		c.Totals[SockTXUnreachable] = 1
		m.Clients = append(m.Clients, c)
	}
	f := gather(t, m, 2)

	// Names follow the conventions: prefix, _total on counters only.
	for name, fam := range f {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if !strings.HasPrefix(name, "bypassd_") {
			t.Errorf("%s: no bypassd_ prefix", name)
		}
		isCounter := fam.GetType() == dto.MetricType_COUNTER
		if isCounter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s: type %v (counters, and only they, end in _total)", name, fam.GetType())
		}
		if fam.GetHelp() == "" {
			t.Errorf("%s: no help", name)
		}
	}
	for _, want := range []string{"go_goroutines", "process_cpu_seconds_total", "bypassd_build_info"} {
		if f[want] == nil {
			t.Errorf("%s missing", want)
		}
	}
	if bi := f["bypassd_build_info"].GetMetric()[0]; labels(bi)["version"] != "v9" || labels(bi)["stats_version"] != strconv.Itoa(Version) {
		t.Errorf("build info %v", labels(bi))
	}

	for name, want := range map[string]float64{"bypassd_tc_tx_packets_total": 8, "bypassd_tc_tx_bytes_total": 8000,
		"bypassd_tc_tx_backlog_bytes": 100, "bypassd_tc_tx_held_total": 2, "bypassd_tc_rx_packets_total": 3, "bypassd_tc_rx_bytes_total": 300} {
		ms := f[name].GetMetric()
		if len(ms) != 1 || value(ms[0]) != want || labels(ms[0])["tc"] != "5" || labels(ms[0])["queue"] != "1" {
			t.Errorf("%s: %v, want one series of tc 5 on eth1/1 = %v", name, ms, want)
		}
	}

	rx := f["bypassd_ring_rx_packets_total"].GetMetric()
	if len(rx) != 3 {
		t.Fatalf("%d ring series", len(rx))
	}
	for _, s := range rx {
		l := labels(s)
		want := map[string]float64{"eth1/0": 5, "eth1/1": 7, "eth2/0": 11}[l["interface"]+"/"+l["queue"]]
		if value(s) != want {
			t.Errorf("ring %v = %v, want %v", l, value(s), want)
		}
	}
	drops := 0
	for _, s := range f["bypassd_ring_rx_dropped_packets_total"].GetMetric() {
		if labels(s)["reason"] == "checksum" {
			drops++
			if value(s) != 3 {
				t.Errorf("checksum drops %v", value(s))
			}
		}
	}
	if drops != 3 {
		t.Errorf("%d checksum series", drops)
	}
	// The XDP program is per interface: one series each.
	if x := f["bypassd_xdp_redirected_packets_total"].GetMetric(); len(x) != 2 {
		t.Errorf("%d XDP series, want one per interface", len(x))
	}
	if u := f["bypassd_ring_umem_bytes"].GetMetric()[0]; value(u) != 16*2048 {
		t.Errorf("UMEM %v", value(u))
	}
	if d := f["bypassd_ring_dev_mem_alloc_bytes"].GetMetric(); len(d) != 3 || value(d[0]) != 64<<10 {
		t.Errorf("device memory granted: %v", d)
	}
	if o := f["bypassd_ring_dev_mem_oob_packets_total"].GetMetric(); len(o) != 3 || value(o[0]) != 4 {
		t.Errorf("device memory oob: %v", o)
	}
	// The error gauge exists only where it means something: sync mode.
	if m := f["bypassd_ring_hw_timestamp_mode"].GetMetric(); len(m) != 3 {
		t.Errorf("%d timestamp mode series, want one per ring", len(m))
	}
	if e := f["bypassd_ring_hw_timestamp_error_seconds"].GetMetric(); len(e) != 1 || value(e[0]) != 250e-9 || labels(e[0])["interface"] != "eth2" {
		t.Errorf("timestamp error series %v", e)
	}

	// Two clients of their own (the earliest connected), the third summed.
	got := map[string]float64{}
	for _, s := range f["bypassd_client_rx_packets_total"].GetMetric() {
		got[labels(s)["pid"]+" "+labels(s)["command"]] = value(s)
	}
	if len(got) != 3 || got["30 appa"] != 30 || got["10 appb"] != 10 || got["other other"] != 20 {
		t.Errorf("client series %v", got)
	}
	if v := value(f["bypassd_clients_aggregated"].GetMetric()[0]); v != 1 {
		t.Errorf("aggregated %v", v)
	}
	if v := value(f["bypassd_clients"].GetMetric()[0]); v != 3 {
		t.Errorf("clients %v", v)
	}
	for _, s := range f["bypassd_client_tx_dropped_packets_total"].GetMetric() {
		if l := labels(s); l["reason"] == "unreachable" && value(s) != 1 {
			t.Errorf("unreachable %v %v", l, value(s))
		}
	}
	if v := value(f["bypassd_sessions"].GetMetric()[0]); v != 3 {
		t.Errorf("sessions %v", v)
	}
	for _, s := range f["bypassd_control_errors_total"].GetMetric() {
		if l := labels(s); l["code"] == "OPEN" && value(s) != 1 {
			t.Errorf("OPEN errors %v", value(s))
		}
	}

	// Without clients nothing per client is exported, and the default
	// limit applies.
	f = gather(t, &Metrics{}, 0)
	if f["bypassd_client_rx_packets_total"] != nil {
		t.Error("client series without clients")
	}
}

// TestCardinalityBounded: Prometheus gets no series per socket, and no
// more per-client series than the collector's limit: the series count of
// 100 clients with 1,000 sockets each is that of 4 clients with one
// socket each (a limit of 3 plus the "other" sum), whatever the sockets'
// counters.
func TestCardinalityBounded(t *testing.T) {
	metrics := func(clients, sockets int) *Metrics {
		m := &Metrics{Rings: []Ring{{Interface: "eth1", Provider: "afxdp", Mode: "native/copy", Sockets: clients * sockets}}}
		for i := range clients {
			c := ClientMetrics{PID: 100 + i, Command: "app", Started: int64(i), Sockets: sockets}
			c.Totals[SockRXPackets] = uint64(i * sockets)
			m.Clients = append(m.Clients, c)
		}
		return m
	}
	count := func(f map[string]*dto.MetricFamily) int {
		n := 0
		for name, fam := range f {
			if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
				continue
			}
			for _, m := range fam.GetMetric() {
				for l := range labels(m) {
					if l == "socket" || l == "port" || l == "local" || l == "peer" {
						t.Errorf("%s has a per-socket label %q", name, l)
					}
				}
			}
			n += len(fam.GetMetric())
		}
		return n
	}
	small, large := count(gather(t, metrics(4, 1), 3)), count(gather(t, metrics(100, 1000), 3))
	t.Logf("%d series for 4 clients of 1 socket, %d for 100 clients of 1,000", small, large)
	if small != large {
		t.Errorf("%d series for 4 clients of 1 socket, %d for 100 clients of 1,000: the count follows the clients or sockets", small, large)
	}
}
