package main

import (
	"bytes"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/sched/qos"
	"github.com/bypassd/bypassd/socket"
)

// The document's second mlnx_qos example (-s ets,ets,strict
// -p 0,1,1,1,2,2,2 -t 30,70 -r 3,4,2 on an all-zero egress map) printed
// field by field as mlnx_qos prints it.
func TestPrintQoSDocumentExample(t *testing.T) {
	c := qos.Default()
	for _, err := range []error{
		c.SetTSA("ets,ets,strict"), c.SetPrioTC("0,1,1,1,2,2,2"), c.SetTCBW("30,70"),
		c.SetRateLimit("3,4,2"), c.SetSkPrioUP("0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	printQoS(&b, &ctldoc.QoSInterface{Interface: "ens1f0", Rings: 1, Config: c})
	out := b.String()
	for _, want := range []string{
		"Priority trust state: pcp\n",
		"\tprio:0 dscp:07,06,05,04,03,02,01,00,\n",
		"\tprio:7 dscp:63,62,61,60,59,58,57,56,\n",
		"tc: 0 ratelimit: 3 Gbps, tsa: ets, bw: 30%\n\t up: 0\n\t\t skprio: 0\n\t\t skprio: 1\n\t\t skprio: 2 (tos: 8)\n\t\t skprio: 3\n\t\t skprio: 4 (tos: 24)\n\t\t skprio: 5\n\t\t skprio: 6 (tos: 16)\n\t\t skprio: 7\n",
		"\t\t skprio: 15\n\t up: 7\n",
		"tc: 1 ratelimit: 4 Gbps, tsa: ets, bw: 70%\n\t up: 1\n\t up: 2\n\t up: 3\n",
		"tc: 2 ratelimit: 2 Gbps, tsa: strict\n\t up: 4\n\t up: 5\n\t up: 6\n",
		"Forced traffic_class: off, ttl: off\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// bypassctl qos against a daemon: the document's "-s ets,ets -t 30,70"
// changes the daemon's state and its QoS file (read back as a restart
// would), bad settings are refused with what to fix and change nothing.
func TestQoSAgainstDaemon(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	file := filepath.Join(t.TempDir(), "qos.json")
	tc := uint8(96)
	srv := daemontest.Start(t, p, config.Config{QoSPath: file, TrafficClass: &tc}, nil)
	sock, ifn := srv.SocketPath(), p.A.Name
	out := mustCtl(t, sock, "qos", "-i", ifn)
	for _, want := range []string{"Interface: " + ifn + " (1 ring)", "tc: 0 ratelimit: unlimited, tsa: ets, bw: 13%\n\t up: 1\n",
		"Forced traffic_class: 96 (dscp 24), ttl: off"} {
		if !strings.Contains(out, want) {
			t.Errorf("default state: no %q in:\n%s", want, out)
		}
	}
	out = mustCtl(t, sock, "qos", "-i", ifn, "-s", "ets,ets", "-t", "30,70", "-r", "0,0,0,0,0,0,0,100M", "--trust", "dscp",
		"--dscp2prio", "set,46,6", "-p", "0,1,2,3,4,5,6,7", "--ttl", "9")
	for _, want := range []string{"tc: 0 ratelimit: unlimited, tsa: ets, bw: 30%\n\t up: 0\n", "tc: 1 ratelimit: unlimited, tsa: ets, bw: 70%\n",
		"tc: 7 ratelimit: 100 Mbps, tsa: ets, bw: 0%", "Priority trust state: dscp", "prio:6 dscp:55,54,53,52,51,50,49,48,46,",
		"Forced traffic_class: 96 (dscp 24), ttl: 9"} {
		if !strings.Contains(out, want) {
			t.Errorf("after setting: no %q in:\n%s", want, out)
		}
	}
	saved, err := config.LoadQoSFile(file)
	if err != nil {
		t.Fatal(err)
	}
	got := saved.Interfaces[ifn]
	if got.BW[0] != 30 || got.BW[1] != 70 || got.Trust != qos.TrustDSCP || got.RateKbps[7] != 100_000 || got.TTL != 9 || got.DSCP2Prio[46] != 6 {
		t.Errorf("QoS file after the change: %+v", got)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-t", "30,60"}, "the ETS classes' bandwidths sum to 90%, want 100%"},
		{[]string{"-s", "ets,fair"}, `"fair" is not a transmission algorithm: use strict or ets`},
		{[]string{"-p", "0,9"}, `prio_tc: entry 1 is "9", want 0..7`},
		{[]string{"--trust", "none"}, "use pcp or dscp"},
		{[]string{"--dscp2prio", "set,64,1"}, "want 0..63"},
		{[]string{"-r", "fast"}, "want Gbit/s"},
		{[]string{"--traffic-class", "300"}, "want a ToS byte 0..255"},
	} {
		_, err := ctl(t, sock, append([]string{"qos", "-i", ifn}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("qos %v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
	if _, err := ctl(t, sock, "qos", "-s", "strict"); err == nil || !strings.Contains(err.Error(), "-i IF") {
		t.Errorf("setting without -i: %v", err)
	}
	if _, err := ctl(t, sock, "qos", "-i", "nosuch0"); err == nil || !strings.Contains(err.Error(), "does not serve interface") {
		t.Errorf("unknown interface: %v", err)
	}
	if again, _ := config.LoadQoSFile(file); again.Interfaces[ifn] != got {
		t.Errorf("a refused change reached the QoS file")
	}
}

// The acceptance check: `bypassctl qos -i IF -s ets,ets -t 30,70`
// changes what an independent receiver (a kernel socket in the peer
// namespace) measures. Two client sockets, at sk_prio 0 and 1 (UP 0 and 1,
// TC 0 and 1 with -p 0,1,...), keep their queues full while a port limit
// set with --maxrate holds the ring; then the limit opens under 50/50 and
// under 30/70 and the receiver counts each class's share of a window of
// datagrams it received (shares of wire bytes: one datagram size).
func TestQoSChangesWhatAReceiverMeasures(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	// Queues that hold a round's datagrams (700 of 1000 bytes).
	srv := daemontest.Start(t, p, config.Config{QueueBytes: 1 << 20}, nil)
	sock, ifn := srv.SocketPath(), p.A.Name
	recv := p.B.NS.ListenUDP(t, netip.AddrPortFrom(p.B.Addr4(), 0))
	_ = recv.SetReadBuffer(4 << 20)
	dst := recv.LocalAddr().(*net.UDPAddr).AddrPort()
	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var conns [2]*socket.UDPConn
	for prio := range conns {
		u, err := c.ListenUDP("udp4", netip.AddrPortFrom(p.A.Addr4(), 0))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		if err := u.SetOption("SO_PRIORITY", prio); err != nil {
			t.Fatal(err)
		}
		conns[prio] = u
	}
	lowPort := conns[0].LocalAddr().(*net.UDPAddr).AddrPort().Port()
	buf := make([]byte, 2048)
	// drain reads until nothing arrives for d.
	drain := func(d time.Duration) {
		for {
			_ = recv.SetReadDeadline(time.Now().Add(d))
			if _, _, err := recv.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}
	const dgram, queued, window = 1000, 700, 400
	share := func(tcbw string) float64 {
		t.Helper()
		// Empty the queues of what the last round left, hold the ring
		// (1 kbit/s), let what left before arrive, then fill both queues.
		mustCtl(t, sock, "qos", "-i", ifn, "--maxrate", "0")
		drain(300 * time.Millisecond)
		mustCtl(t, sock, "qos", "-i", ifn, "-p", "0,1,2,3,4,5,6,7", "--maxrate", "1k")
		drain(300 * time.Millisecond)
		for _, u := range conns {
			_ = u.SetWriteDeadline(time.Now().Add(10 * time.Second))
			for i := range queued {
				if _, err := u.WriteToUDPAddrPort(make([]byte, dgram), dst); err != nil {
					t.Fatalf("queueing datagram %d: %v", i, err)
				}
			}
		}
		drain(300 * time.Millisecond) // the bucket a new state starts with
		// Open at 8 Mbit/s under the shares: both classes stay backlogged
		// for the whole window (the 70% class needs 280 of its 700).
		mustCtl(t, sock, "qos", "-i", ifn, "-s", "ets,ets", "-t", tcbw, "--maxrate", "8M")
		low := 0
		for i := range window {
			_ = recv.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, from, err := recv.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("-t %s: datagram %d of %d: %v", tcbw, i, window, err)
			}
			if from.Port() == lowPort {
				low++
			}
		}
		return float64(low) / window
	}
	even, skewed := share("50,50"), share("30,70")
	t.Logf("TC 0's share at the receiver: %.3f under -t 50,50, %.3f under -t 30,70", even, skewed)
	if even < 0.45 || even > 0.55 {
		t.Errorf("-s ets,ets -t 50,50: TC 0 got %.1f%% of the datagrams, want 50%% ±5", 100*even)
	}
	if skewed < 0.25 || skewed > 0.35 {
		t.Errorf("-s ets,ets -t 30,70: TC 0 got %.1f%% of the datagrams, want 30%% ±5", 100*skewed)
	}
	mustCtl(t, sock, "qos", "-i", ifn, "--maxrate", "0")
	drain(500 * time.Millisecond)
}
