package daemon

import (
	"context"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/stats"
)

// waitFile waits until the stats file at path satisfies ok (nil: exists).
func waitFile(t *testing.T, path string, ok func(*stats.Snapshot) bool) *stats.Snapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := stats.ReadFile(path)
		if err == nil && (ok == nil || ok(s)) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached the expected state (last %+v, %v)", path, s, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitGone(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStatsFileLifecycle(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{StatsInterval: 10 * time.Millisecond})
	dir := l.cfg.StatsDir
	self := stats.ClientPath(dir, os.Getpid())
	// The daemon's own file exists from the start.
	ds := waitFile(t, stats.DaemonPath(dir, os.Getpid()), func(s *stats.Snapshot) bool { return s.Header.Generation > 0 })
	if ds.Daemon.SocketPath != l.cfg.SocketPath || len(ds.Rings) != 1 || ds.Rings[0].Interface != l.p.A.Name {
		t.Errorf("daemon file %+v %+v", ds.Daemon, ds.Rings)
	}
	// A tool's session gets no file.
	tool := newClient(t, l.cfg.SocketPath)
	h := ctlproto.NewHello("bypass-stats")
	h.Flags = ctlproto.HelloFlagNoStats
	if _, err := tool.ok(ctlproto.CodeHello, 0, h); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if _, err := os.Stat(self); !os.IsNotExist(err) {
		t.Errorf("a NO_STATS session got a stats file: %v", err)
	}
	// A client's HELLO creates it, with the process's identity.
	c, err := dialClient(l.cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.hello(); err != nil {
		t.Fatal(err)
	}
	s := waitFile(t, self, nil)
	if s.Header.PID != os.Getpid() || s.Header.WriterPID != os.Getpid() || s.Header.Program != "daemon-test" ||
		s.Header.Kind != stats.KindClient || s.Header.SocketSlots != config.DefaultMaxSockets {
		t.Errorf("client header %+v", s.Header)
	}
	// A second connection of the same process shares the file; it stays
	// until the last one goes.
	c2, err := dialClient(l.cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.hello(); err != nil {
		t.Fatal(err)
	}
	_ = c.c.Close()
	time.Sleep(30 * time.Millisecond)
	if _, err := stats.ReadFile(self); err != nil {
		t.Errorf("file gone while a connection remains: %v", err)
	}
	_ = c2.c.Close()
	waitGone(t, self)

	// Another process: its file comes and goes with it, kill -9 included.
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ch := startChild(t, bin, "hold", []string{envSocket + "=" + l.cfg.SocketPath, envAddr + "=" + l.p.A.Addr4().String()}, nil)
	ch.line(t)
	child := stats.ClientPath(dir, ch.cmd.Process.Pid)
	// A publication between the child's OPEN and its BIND shows the socket
	// unbound: wait for one after the bind.
	cs := waitFile(t, child, func(s *stats.Snapshot) bool {
		return len(s.Sockets) == 1 && s.Sockets[0].Flags&stats.SocketBound != 0
	})
	if sk := cs.Sockets[0]; sk.Local.Addr() != l.p.A.Addr4() || sk.Ring != 0 {
		t.Errorf("child's socket %+v", sk)
	}
	_ = ch.cmd.Process.Kill()
	_ = ch.cmd.Wait()
	waitGone(t, child)
}

func TestStatsCountPacketForPacket(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{StatsInterval: 10 * time.Millisecond})
	c := helloClient(t, l)
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	deadline := time.Now().Add(10 * time.Second)
	open := func() (*clientSocket, netip.AddrPort) {
		s, err := c.open(unix.AF_INET, 0)
		if err != nil {
			t.Fatal(err)
		}
		local, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
		if err != nil {
			t.Fatal(err)
		}
		return s, local
	}
	// rx datagrams of rxSize in, tx of txSize out, one at a time.
	traffic := func(s *clientSocket, local netip.AddrPort, rx, rxSize, tx, txSize int) {
		buf := make([]byte, 4096)
		msgs := []sockq.Message{{Buf: buf}}
		for i := 0; i < rx; i++ {
			if _, err := peer.WriteToUDPAddrPort(make([]byte, rxSize), local); err != nil {
				t.Fatal(err)
			}
			if n, err := s.conn.RecvBatch(msgs, deadline); n != 1 || err != nil {
				t.Fatalf("receive %d: %d %v", i, n, err)
			}
		}
		for i := 0; i < tx; i++ {
			if n, err := s.conn.SendBatch([][]byte{make([]byte, txSize)}, peerAddr, deadline); n != 1 || err != nil {
				t.Fatalf("send %d: %d %v", i, n, err)
			}
			_ = peer.SetReadDeadline(deadline)
			if _, _, err := peer.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	s1, local1 := open()
	s2, local2 := open()
	defer s2.close()
	traffic(s1, local1, 30, 300, 20, 200)
	traffic(s2, local2, 7, 70, 3, 30)
	path := stats.ClientPath(l.cfg.StatsDir, os.Getpid())
	snap := waitFile(t, path, func(s *stats.Snapshot) bool {
		return len(s.Sockets) == 2 && s.Client.Totals[stats.SockTXPackets] == 23
	})
	want := map[uint32][4]uint64{s1.id: {30, 30 * 300, 20, 20 * 200}, s2.id: {7, 7 * 70, 3, 3 * 30}}
	for _, sk := range snap.Sockets {
		c := sk.Counters
		w := want[sk.ID]
		if [4]uint64{c[stats.SockRXPackets], c[stats.SockRXBytes], c[stats.SockTXPackets], c[stats.SockTXBytes]} != w ||
			c[stats.SockRXDropped] != 0 || c[stats.SockTXErrors] != 0 || c[stats.SockTXUnreachable] != 0 {
			t.Errorf("socket %d: %v, want rx/tx %v", sk.ID, c, w)
		}
		if c[stats.SockRXBatches] == 0 || c[stats.SockRXWakeups] > c[stats.SockRXBatches] {
			t.Errorf("socket %d: %d batches, %d wake-ups", sk.ID, c[stats.SockRXBatches], c[stats.SockRXWakeups])
		}
	}
	if snap.Client.SocketsOpened != 2 || snap.Client.Sockets != 2 || snap.Client.QueueMemory != 2*shmsess.SocketSpan(l.cfg.QueueBytes) {
		t.Errorf("client block %+v", snap.Client)
	}

	// A closed socket's counters stay in the totals.
	if _, err := c.ok(ctlproto.CodeClose, s1.id, ctlproto.Empty{}); err != nil {
		t.Fatal(err)
	}
	s1.close()
	snap = waitFile(t, path, func(s *stats.Snapshot) bool { return len(s.Sockets) == 1 })
	if tot := snap.Client.Totals; tot[stats.SockRXPackets] != 37 || tot[stats.SockTXBytes] != 20*200+3*30 {
		t.Errorf("totals after a close: %v", tot)
	}

	// ZERO_STATS: the file counts from zero again, the raw counters (and so
	// the metrics) do not.
	if _, err := c.ok(ctlproto.CodeZeroStats, 0, ctlproto.ZeroStats{PID: uint32(os.Getpid())}); err != nil {
		t.Fatal(err)
	}
	snap = waitFile(t, path, func(s *stats.Snapshot) bool { return s.Header.Resets == 1 })
	if c := snap.Sockets[0].Counters; c[stats.SockRXPackets] != 0 || c[stats.SockTXBytes] != 0 || snap.Client.Totals[stats.SockRXPackets] != 0 {
		t.Errorf("after zeroing: %v totals %v", c, snap.Client.Totals)
	}
	traffic(s2, local2, 2, 10, 0, 0)
	snap = waitFile(t, path, func(s *stats.Snapshot) bool { return s.Sockets[0].Counters[stats.SockRXPackets] == 2 })
	if snap.Client.Totals[stats.SockRXPackets] != 2 {
		t.Errorf("totals after zeroing and 2 more: %v", snap.Client.Totals)
	}
	// Queued bytes show, and go once the client reads them (which moves
	// no counter); an idle client's file keeps being published (its
	// generation and time move) without its sockets' blocks changing.
	for range 3 {
		if _, err := peer.WriteToUDPAddrPort(make([]byte, 100), local2); err != nil {
			t.Fatal(err)
		}
	}
	waitFile(t, path, func(s *stats.Snapshot) bool { return s.Sockets[0].Counters[stats.SockRXQueueBytes] > 0 })
	msgs := []sockq.Message{{Buf: make([]byte, 4096)}}
	for i := range 3 {
		if n, err := s2.conn.RecvBatch(msgs, deadline); n != 1 || err != nil {
			t.Fatalf("receive queued datagram %d: %d %v", i, n, err)
		}
	}
	idle := waitFile(t, path, func(s *stats.Snapshot) bool { return s.Sockets[0].Counters[stats.SockRXQueueBytes] == 0 })
	later := waitFile(t, path, func(s *stats.Snapshot) bool { return s.Header.Generation > idle.Header.Generation+2 })
	if !later.Header.Updated.After(idle.Header.Updated) || later.Sockets[0].Counters != idle.Sockets[0].Counters {
		t.Errorf("idle client: updated %v then %v, counters %v then %v", idle.Header.Updated, later.Header.Updated,
			idle.Sockets[0].Counters, later.Sockets[0].Counters)
	}
	m := l.d.metricsSnapshot()
	if len(m.Clients) != 1 || m.Clients[0].Totals[stats.SockRXPackets] != 42 || m.Clients[0].PID != os.Getpid() || m.Clients[0].Sockets != 1 {
		t.Errorf("metrics (never zeroed): %+v", m.Clients)
	}
	if m.Rings[0].Counters[stats.RingRXPackets] != 42 || m.Daemon[stats.DaemonSocketsTotal] != 2 || m.Daemon[stats.DaemonSockets] != 1 {
		t.Errorf("metrics rings %v daemon %v", m.Rings[0].Counters, m.Daemon)
	}
	// The daemon's own file zeroes separately.
	dpath := stats.DaemonPath(l.cfg.StatsDir, os.Getpid())
	if _, err := c.ok(ctlproto.CodeZeroStats, 0, ctlproto.ZeroStats{Daemon: true}); err != nil {
		t.Fatal(err)
	}
	ds := waitFile(t, dpath, func(s *stats.Snapshot) bool { return s.Header.Resets == 1 })
	if ds.Rings[0].Counters[stats.RingRXPackets] != 0 || ds.Daemon.Counters[stats.DaemonSockets] != 1 {
		t.Errorf("daemon file after zeroing: %v %v", ds.Rings[0].Counters, ds.Daemon.Counters)
	}
	// A pid that is not a client.
	r, err := c.call(ctlproto.CodeZeroStats, 0, ctlproto.ZeroStats{PID: 999999999})
	if err != nil || r.h.Status != unix.ESRCH {
		t.Errorf("zero an unknown pid: %v %v", r.h.Status, err)
	}
}

func TestSetLogLevelAndStatsOff(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{StatsInterval: -1})
	c := helloClient(t, l)
	if entries, _ := os.ReadDir(l.cfg.StatsDir); len(entries) != 0 {
		t.Errorf("stats files with publishing off: %v", entries)
	}
	r, err := c.call(ctlproto.CodeZeroStats, 0, ctlproto.ZeroStats{})
	if err != nil || r.h.Status != unix.EOPNOTSUPP {
		t.Errorf("zero with stats off: %v %v", r.h.Status, err)
	}
	// newLab gives no LogLevel: the level is fixed.
	r, err = c.call(ctlproto.CodeSetLogLevel, 0, ctlproto.LogLevel{Level: ctlproto.LogLevelDebug})
	if err != nil || r.h.Status != unix.EOPNOTSUPP {
		t.Errorf("set a fixed level: %v %v", r.h.Status, err)
	}
	// Metrics still see the client.
	if m := l.d.metricsSnapshot(); len(m.Clients) != 1 {
		t.Errorf("metrics clients with stats off: %+v", m.Clients)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{MetricsAddr: "127.0.0.1:0", Version: "v-test"})
	addr := l.d.MetricsAddr()
	if addr == "" || strings.HasSuffix(addr, ":0") {
		t.Fatalf("metrics address %q", addr)
	}
	// The listener lives in A's namespace: dial from there.
	web := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			var conn net.Conn
			err := l.p.A.NS.Do(func() error {
				var err error
				conn, err = (&net.Dialer{}).DialContext(ctx, network, a)
				return err
			})
			return conn, err
		}}}
	resp, err := web.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`bypassd_build_info{goversion=`, `version="v-test"`, `bypassd_ring_info{interface="` + l.p.A.Name + `",mode=`,
		"bypassd_sessions 0", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if resp, err := web.Get("http://" + addr + "/nothing"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown path: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// A taken address is a clear start-up error.
	other := &Daemon{cfg: config.Resolved{Config: config.Config{MetricsAddr: addr}}, log: zap.NewNop()}
	err = l.p.A.NS.Do(func() error { return other.startMetrics() })
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("taken metrics address: %v", err)
		_ = other.stopMetrics()
	}
}

func TestStatsConfig(t *testing.T) {
	base := config.Config{Interfaces: []config.Interface{{Name: "eth0"}}}
	c := base.WithDefaults()
	if c.StatsInterval != config.DefaultStatsInterval || c.MetricsMaxClients != stats.DefaultMaxClients || c.MetricsAddr != "" || c.Version != "dev" {
		t.Errorf("defaults %+v", c)
	}
	for _, tc := range []struct {
		mod  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.StatsInterval = time.Microsecond }, "at least 1ms"},
		{func(c *config.Config) { c.MetricsAddr = "9465" }, "HOST:PORT"},
		{func(c *config.Config) { c.MetricsMaxClients = -1 }, "must be positive"},
	} {
		c := base
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", c, err, tc.want)
		}
	}
	// The stats files' mode follows the control socket's read bits.
	for sock, want := range map[os.FileMode]os.FileMode{0o660: 0o640, 0o666: 0o644, 0o600: 0o600} {
		d := &Daemon{cfg: config.Resolved{Config: config.Config{SocketMode: sock}}}
		if got := d.statsMode(); got != want {
			t.Errorf("socket mode %#o: stats mode %#o, want %#o", sock, got, want)
		}
	}
}

// TestSortByID: the blocks come out in id order, each with its own
// contents, whatever order the sessions' maps gave them in.
func TestSortByID(t *testing.T) {
	var c clientStats
	for _, n := range []int{0, 1, 2, 7, 1000} {
		blocks := make([]stats.Socket, n)
		for i, id := range rand.Perm(n) {
			blocks[i] = stats.Socket{ID: uint32(id + 1), Counters: stats.SocketCounters{stats.SockRXPackets: uint64(id + 1)}}
		}
		c.sortByID(blocks)
		for i, b := range blocks {
			if b.ID != uint32(i+1) || b.Counters[stats.SockRXPackets] != uint64(i+1) {
				t.Fatalf("%d blocks: place %d holds id %d with counter %d", n, i, b.ID, b.Counters[stats.SockRXPackets])
			}
		}
	}
}
