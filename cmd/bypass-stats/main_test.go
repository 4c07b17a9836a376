package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/socket"
	"github.com/bypassd/bypassd/stats"
)

// envExec makes the test binary run bypass-stats's main (for tests that
// need another uid).
const envExec = "BYPASS_STATS_TEST_EXEC"

func TestMain(m *testing.M) {
	if os.Getenv(envExec) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// lab is a veth pair with an in-process bypassd on A's end; this test
// process is also its client, so its stats file is named after our pid.
type lab struct {
	p     *netlab.Pair
	d     *daemon.Daemon
	dir   string // world-traversable: holds the control socket and stats
	stats string
	sock  string
	level zap.AtomicLevel
}

func newLab(t *testing.T) *lab {
	t.Helper()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	srv := daemontest.Start(t, p, config.Config{
		QueueBytes:    256 << 10,
		StatsInterval: 10 * time.Millisecond,
		// Room for every frame TestViewsMatchTraffic sends at once, so
		// none is oob.
		DevMemTX: 256 << 10,
		// Staging needs a fixed provider: no TAP fallback.
		Fallback: "none",
		Version:  "test",
		LogLevel: &level,
	}, zaptest.NewLogger(t, zaptest.Level(level)))
	l := &lab{p: p, d: srv.Daemon, dir: srv.Dir, stats: srv.Config.StatsDir, sock: srv.SocketPath(), level: level}
	return l
}

func (l *lab) client(t *testing.T) *socket.Client {
	t.Helper()
	c, err := socket.Dial(l.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// listen binds a socket of c on A's address (any port), closed when the
// test ends.
func (l *lab) listen(t *testing.T, c *socket.Client) *socket.UDPConn {
	t.Helper()
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() })
	return u
}

// kernelUDP opens a kernel socket in B.
func (l *lab) kernelUDP(t *testing.T) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := l.p.B.NS.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.p.B.Addr4(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exchange sends rx datagrams of rxSize bytes from B to u and tx datagrams
// of txSize bytes from u to B, checking each side got all of them.
func exchange(t *testing.T, u *socket.UDPConn, peer *net.UDPConn, rx, rxSize, tx, txSize int) {
	t.Helper()
	to := u.LocalAddr().(*net.UDPAddr).AddrPort()
	buf := make([]byte, 65536)
	for i := 0; i < rx; i++ {
		if _, err := peer.WriteToUDPAddrPort(make([]byte, rxSize), to); err != nil {
			t.Fatal(err)
		}
		// One at a time: the kernel side must not drop any.
		_ = u.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, _, err := u.ReadFromUDPAddrPort(buf); err != nil || n != rxSize {
			t.Fatalf("shim receive %d: %d bytes, %v", i, n, err)
		}
	}
	from := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	for i := 0; i < tx; i++ {
		if _, err := u.WriteToUDPAddrPort(make([]byte, txSize), from); err != nil {
			t.Fatal(err)
		}
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, _, err := peer.ReadFromUDPAddrPort(buf); err != nil || n != txSize {
			t.Fatalf("kernel receive %d: %d bytes, %v", i, n, err)
		}
	}
}

// waitStats waits until the stats file of pid satisfies ok.
func (l *lab) waitStats(t *testing.T, path string, ok func(*stats.Snapshot) bool) *stats.Snapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := stats.ReadFile(path)
		if err == nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats file %s never reached the expected state (last: %+v, %v)", path, s, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cli runs bypass-stats in this process.
func (l *lab) cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := run(context.Background(), append([]string{"-S", l.stats}, args...), func(string) string { return "" }, &out, &errb)
	return out.String(), errb.String(), rc
}

func (l *lab) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, rc := l.cli(t, args...)
	if rc != 0 {
		t.Fatalf("bypass-stats %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, rc, out, errs)
	}
	return out
}

// fields returns the whitespace-separated fields of the first line that
// starts (after spaces) with prefix.
func fields(t *testing.T, out, prefix string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), prefix) {
			return strings.Fields(line)
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, out)
	return nil
}

func TestViewsMatchTraffic(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t)
	u := l.listen(t, l.client(t))
	peer := l.kernelUDP(t)
	const rx, rxSize, tx, txSize = 100, 1000, 50, 2048
	exchange(t, u, peer, rx, rxSize, tx, txSize)
	id := strconv.Itoa(int(u.ID()))
	pid := strconv.Itoa(os.Getpid())
	local := u.LocalAddr().(*net.UDPAddr).AddrPort().String()

	// Packet for packet in the file first.
	clientFile := stats.ClientPath(l.stats, os.Getpid())
	snap := l.waitStats(t, clientFile, func(s *stats.Snapshot) bool {
		return len(s.Sockets) == 1 && s.Sockets[0].Counters[stats.SockTXPackets] == tx
	})
	sc := snap.Sockets[0].Counters
	if sc[stats.SockRXPackets] != rx || sc[stats.SockRXBytes] != rx*rxSize || sc[stats.SockTXBytes] != tx*txSize ||
		sc[stats.SockRXDropped] != 0 || sc[stats.SockTXErrors] != 0 || sc[stats.SockRXBatches] < 1 ||
		snap.Client.Totals[stats.SockRXPackets] != rx || snap.Client.Sockets != 1 {
		t.Errorf("socket counters %v, totals %v", sc, snap.Client.Totals)
	}
	ds := l.waitStats(t, stats.DaemonPath(l.stats, os.Getpid()), func(s *stats.Snapshot) bool {
		return len(s.Rings) == 1 && s.Rings[0].Counters[stats.RingTXPackets] == tx
	})
	rc := ds.Rings[0].Counters
	if rc[stats.RingRXPackets] != rx || rc[stats.RingRXBytes] != rx*rxSize || rc[stats.RingTXBytes] != tx*txSize ||
		rc[stats.RingXDPRedirected] != rx || ds.Rings[0].Sockets != 1 ||
		// 2048-byte datagrams over a 1500-byte MTU go as two fragments.
		rc[stats.RingTXFragments] != 2*tx || rc[stats.RingProviderTXPackets] != 2*tx || rc[stats.RingProviderRXPackets] != rx {
		t.Errorf("ring counters %v", rc)
	}

	// -v 1: two lines per socket.
	out := l.mustCLI(t, "-p", pid, "-v", "1", "-c", "1")
	rxLine := fields(t, out, id+" Rx:")
	txLine := fields(t, out, "Tx:")
	// socket Rx: pkt Kbyte eagain error poll% kernel-pkt kernel-Kbyte
	if rxLine[2] != "100" || rxLine[3] != strconv.Itoa(rx*rxSize/1024) || rxLine[5] != "0" || rxLine[7] != "0" || rxLine[8] != "0" {
		t.Errorf("-v 1 Rx line %v\n%s", rxLine, out)
	}
	if txLine[1] != "50" || txLine[2] != "100" || txLine[4] != "0" || txLine[5] != "na" {
		t.Errorf("-v 1 Tx line %v\n%s", txLine, out)
	}
	if !strings.Contains(out, "pid "+pid+" (") || !strings.Contains(out, "client of bypassd "+pid+", 1 socket;") {
		t.Errorf("-v 1 title:\n%s", out)
	}

	// -v 2 adds the queue columns (nothing queued now; max as sampled).
	out = l.mustCLI(t, "-p", pid, "-v", "2", "-c", "1")
	if f := fields(t, out, id+" Rx:"); len(f) != 12 || f[9] != "0" {
		t.Errorf("-v 2 Rx line %v\n%s", f, out)
	}
	t.Logf("bypass-stats -v 2:\n%s", out)

	// -v 3: the full block and the ring.
	out = l.mustCLI(t, "-p", pid, "-v", "3", "-c", "1")
	for _, want := range []string{
		"Socket=[" + id + "]",
		"- Local Address   = [" + local + "]",
		fmt.Sprintf("Rx Offload: %d / %d / ", rx*rxSize/1024, rx),
		fmt.Sprintf("Tx Offload: %d / %d / ", tx*txSize/1024, tx),
		"Rx queue: cur 0 / max ",
		fmt.Sprintf("RING=[0] %s queue 0", l.p.A.Name),
		fmt.Sprintf("Tx Offload: %d / %d [kilobytes/packets]", tx*txSize/1024, tx),
		fmt.Sprintf("Rx Offload: %d / %d [kilobytes/packets]", rx*rxSize/1024, rx),
		fmt.Sprintf("XDP (%s, all queues): %d / ", l.p.A.Name, rx),
		"Totals (closed sockets included): Rx 97 / 100, Tx 100 / 50",
		"Dev Mem Alloc: 262144",
		// Each datagram leaves as a 1514-byte and a 610-byte fragment,
		// both over the 204-byte inline threshold, so both are staged.
		fmt.Sprintf("Dev Mem Stats: %d / %d / 0 [kilobytes/packets/oob]", tx*(1514+610)/1024, 2*tx),
		"Dev Mem Inline: 0, errors: 0",
		"HW Timestamps: mode 0 (disable), estimated error 0 ns", // veth has no PHC
	} {
		if !strings.Contains(out, want) {
			t.Errorf("-v 3 lacks %q:\n%s", want, out)
		}
	}

	t.Logf("bypass-stats -v 3:\n%s", out)
	// -v 5: netstat-like.
	out = l.mustCLI(t, "-p", pid, "-v", "5", "-c", "1")
	if f := fields(t, out, "udp "); f[1] != "Yes" || f[2] != "0" || f[4] != local || f[5] != "*:*" || !strings.HasPrefix(f[6], pid+"/") {
		t.Errorf("-v 5 line %v\n%s", f, out)
	}

	// The daemon (in this process too, so named rather than by pid): its
	// rings and every client's sockets.
	out = l.mustCLI(t, "-n", "bypassd", "-v", "1", "-c", "1")
	if f := fields(t, out, "[0] "+l.p.A.Name+":0"); f[2] != "Rx:" || f[3] != "100" || f[4] != strconv.Itoa(rx*rxSize/1024) || f[5] != "0" {
		t.Errorf("daemon -v 1 ring line %v\n%s", f, out)
	}
	if !strings.Contains(out, "bypassd "+pid+" (test)") || !strings.Contains(out, "clients 1 (1 since start), sockets 1 (1 opened)") {
		t.Errorf("daemon -v 1 title:\n%s", out)
	}
	out = l.mustCLI(t, "-n", "bypassd", "-v", "3", "-c", "1")
	if !strings.Contains(out, fmt.Sprintf("Rx Offload: %d / %d [kilobytes/packets]", rx*rxSize/1024, rx)) ||
		!strings.Contains(out, "control socket "+l.sock) {
		t.Errorf("daemon -v 3:\n%s", out)
	}
	out = l.mustCLI(t, "-n", "bypassd", "-v", "5", "-c", "1")
	if !strings.Contains(out, local) || !strings.Contains(out, pid+"/") {
		t.Errorf("daemon -v 5 lacks our socket:\n%s", out)
	}
	// Without -p or -n: the first live client (us).
	if out = l.mustCLI(t, "-c", "1"); !strings.Contains(out, id+" Rx:") {
		t.Errorf("default target:\n%s", out)
	}
}

func TestDaemonViewsZeroAndFilter(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t)
	c := l.client(t)
	u1, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	u2, err := c.ListenUDP("udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := u2.JoinGroup(netip.MustParseAddr("239.7.7.7")); err != nil {
		t.Fatal(err)
	}
	peer := l.kernelUDP(t)
	exchange(t, u1, peer, 10, 100, 10, 100)
	pid := strconv.Itoa(os.Getpid())
	id1, id2 := strconv.Itoa(int(u1.ID())), strconv.Itoa(int(u2.ID()))
	file := stats.ClientPath(l.stats, os.Getpid())
	l.waitStats(t, file, func(s *stats.Snapshot) bool {
		return len(s.Sockets) == 2 && s.Sockets[0].Counters[stats.SockTXPackets] == 10
	})

	// -v 4 lists the membership; -s filters sockets.
	out := l.mustCLI(t, "-p", pid, "-v", "4", "-c", "1")
	if f := fields(t, out, "239.7.7.7"); f[1] != "*" || f[2] != id2 {
		t.Errorf("-v 4: %v\n%s", f, out)
	}
	out = l.mustCLI(t, "-p", pid, "-v", "1", "-c", "1", "-s", id2)
	if strings.Contains(out, id1+" Rx:") || !strings.Contains(out, id2+" Rx:") {
		t.Errorf("-s %s:\n%s", id2, out)
	}

	// The daemon's multicast view covers every client.
	out = l.mustCLI(t, "-n", "bypassd", "-v", "4", "-c", "1")
	if f := fields(t, out, "239.7.7.7"); f[2] != id2 || f[4] != pid {
		t.Errorf("daemon -v 4: %v\n%s", f, out)
	}
}

func TestZeroAndDeltas(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t)
	u := l.listen(t, l.client(t))
	peer := l.kernelUDP(t)
	exchange(t, u, peer, 20, 100, 0, 0)
	pid := strconv.Itoa(os.Getpid())
	id := strconv.Itoa(int(u.ID()))
	l.waitStats(t, stats.ClientPath(l.stats, os.Getpid()), func(s *stats.Snapshot) bool {
		return len(s.Sockets) == 1 && s.Sockets[0].Counters[stats.SockRXPackets] == 20
	})
	// -z zeroes before printing; later traffic counts from zero.
	out := l.mustCLI(t, "-p", pid, "-z", "-c", "1")
	if f := fields(t, out, id+" Rx:"); f[2] != "0" || !strings.Contains(out, "(zeroed)") {
		t.Errorf("after -z: %v\n%s", f, out)
	}
	exchange(t, u, peer, 5, 100, 0, 0)
	l.waitStats(t, stats.ClientPath(l.stats, os.Getpid()), func(s *stats.Snapshot) bool {
		return s.Sockets[0].Counters[stats.SockRXPackets] == 5
	})
	out = l.mustCLI(t, "-p", pid, "-v", "1", "-c", "1")
	if f := fields(t, out, id+" Rx:"); f[2] != "5" {
		t.Errorf("5 datagrams after -z: %v\n%s", f, out)
	}
	// Deltas: nothing moves, so every rate is 0.
	out = l.mustCLI(t, "-p", pid, "-d", "2", "-i", "0.05", "-c", "2")
	if strings.Count(out, "per second over the last") != 2 {
		t.Errorf("-d 2 -c 2:\n%s", out)
	}
	if f := fields(t, out, id+" Rx:"); f[2] != "0" {
		t.Errorf("-d 2 rate while idle: %v\n%s", f, out)
	}
}

func TestLogLevel(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t)
	out := l.mustCLI(t, "-l", "debug")
	if out != "bypassd log level: info -> debug\n" || l.level.Level() != zap.DebugLevel {
		t.Errorf("-l debug: %q, level now %v", out, l.level.Level())
	}
	out = l.mustCLI(t, "-l", "warn", "--socket", l.sock)
	if !strings.Contains(out, "debug -> warn") || l.level.Level() != zap.WarnLevel {
		t.Errorf("-l warn: %q", out)
	}
	if _, errs, rc := l.cli(t, "-l", "loud"); rc != 2 || !strings.Contains(errs, "want debug, info, warn or error") {
		t.Errorf("-l loud: %d %q", rc, errs)
	}
}

// runAs runs bypass-stats as another user (a re-executed test binary).
func runAs(t *testing.T, uid uint32, args ...string) (string, int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary sits in a directory other users cannot enter.
	bin := filepath.Join(t.TempDir(), "bypass-stats")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "bdstatsbin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	bin = filepath.Join(dir, "bypass-stats")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), envExec+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

func TestErrors(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t)
	l.listen(t, l.client(t))
	pid := strconv.Itoa(os.Getpid())
	l.waitStats(t, stats.ClientPath(l.stats, os.Getpid()), func(s *stats.Snapshot) bool { return len(s.Sockets) == 1 })

	// An unknown pid names what there is.
	_, errs, rc := l.cli(t, "-p", "999999999", "-c", "1")
	if rc != 1 || !strings.Contains(errs, "no stats file for pid 999999999") || !strings.Contains(errs, "no such process") ||
		!strings.Contains(errs, pid+" (bypassd)") {
		t.Errorf("unknown pid: %d %q", rc, errs)
	}
	// A file of another layout version is refused clearly.
	other := filepath.Join(t.TempDir(), "stats")
	_ = os.Mkdir(other, 0o755)
	data, err := os.ReadFile(stats.ClientPath(l.stats, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	data[4] = 9 // version
	if err := os.WriteFile(filepath.Join(other, "1"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, rc = l.cli(t, "-S", other, "-p", "1", "-c", "1")
	if rc != 1 || !strings.Contains(errs, fmt.Sprintf("layout version 9, this program reads version %d", stats.Version)) {
		t.Errorf("wrong version: %d %q", rc, errs)
	}
	// No stats directory.
	_, errs, rc = l.cli(t, "-S", filepath.Join(other, "none"), "-c", "1")
	if rc != 1 || !strings.Contains(errs, "is bypassd running?") {
		t.Errorf("missing directory: %d %q", rc, errs)
	}
	// Usage errors.
	for _, args := range [][]string{{"-v", "6"}, {"-d", "3"}, {"-p", "x"}, {"-s", "5-3"}, {"-q"}, {"-p", "1", "-n", "x"}} {
		if _, errs, rc := l.cli(t, args...); rc != 2 || errs == "" {
			t.Errorf("%v: exit %d %q", args, rc, errs)
		}
	}
	if out, _, rc := l.cli(t, "-V"); rc != 0 || !strings.HasPrefix(out, "bypass-stats ") {
		t.Errorf("-V: %d %q", rc, out)
	}

	// Another user: a stats file only root may read, and the daemon's
	// administrative requests.
	secret := filepath.Join(l.dir, "secret")
	_ = os.Mkdir(secret, 0o755)
	w, err := stats.Create(stats.ClientPath(secret, os.Getpid()), stats.FileSpec{Kind: stats.KindClient, PID: os.Getpid(), Mode: 0o600, GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	out, rc := runAs(t, 65534, "-S", secret, "-p", pid, "-c", "1")
	if rc != 1 || !strings.Contains(out, "permission denied") || !strings.Contains(out, "run as root or join that group") {
		t.Errorf("unreadable file as nobody: %d %q", rc, out)
	}
	out, rc = runAs(t, 65534, "-S", l.stats, "-l", "debug")
	if rc != 1 || !strings.Contains(out, "permission denied: it needs root or bypassd's own user") {
		t.Errorf("-l as nobody: %d %q", rc, out)
	}
	out, rc = runAs(t, 65534, "-S", l.stats, "-p", pid, "-z", "-c", "1")
	if rc != 1 || !strings.Contains(out, "zero the counters of pid "+pid+": permission denied") {
		t.Errorf("-z of root's process as nobody: %d %q", rc, out)
	}
}

// TestReaderAttachDetachDuringTraffic opens and closes the client's stats
// file 1000 times while datagrams flow; every read is consistent and no
// counter ever goes back.
func TestReaderAttachDetachDuringTraffic(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t)
	u := l.listen(t, l.client(t))
	peer := l.kernelUDP(t)
	to := u.LocalAddr().(*net.UDPAddr).AddrPort()
	const size = 200
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // B sends
		defer wg.Done()
		msg := make([]byte, size)
		for !stop.Load() {
			_, _ = peer.WriteToUDPAddrPort(msg, to)
			time.Sleep(20 * time.Microsecond)
		}
	}()
	go func() { // the shim receives
		defer wg.Done()
		buf := make([]byte, 2048)
		for !stop.Load() {
			_ = u.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			_, _, _ = u.ReadFromUDPAddrPort(buf)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	path := stats.ClientPath(l.stats, os.Getpid())
	l.waitStats(t, path, func(s *stats.Snapshot) bool { return len(s.Sockets) == 1 })
	var last stats.SocketCounters
	var lastGen uint64
	for i := 0; i < 1000; i++ {
		r, err := stats.Open(path)
		if err != nil {
			t.Fatalf("attach %d: %v", i, err)
		}
		s, err := r.Read()
		_ = r.Close()
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if len(s.Sockets) != 1 || s.Header.Generation < lastGen {
			t.Fatalf("read %d: %d sockets, generation %d after %d", i, len(s.Sockets), s.Header.Generation, lastGen)
		}
		lastGen = s.Header.Generation
		cur := s.Sockets[0].Counters
		for j, v := range cur {
			if !stats.SocketCounter(j).IsGauge() && v < last[j] {
				t.Fatalf("read %d: %v went back from %d to %d", i, stats.SocketCounter(j), last[j], v)
			}
		}
		// Every datagram has size bytes: a torn word would break this.
		if b, p := cur[stats.SockRXBytes], cur[stats.SockRXPackets]; b%size != 0 || b/size > p+64 || p > b/size+64 {
			t.Fatalf("read %d: %d bytes for %d datagrams of %d bytes", i, b, p, size)
		}
		if s.Client.Totals[stats.SockRXPackets] < cur[stats.SockRXPackets] {
			t.Fatalf("read %d: totals %d below the socket's %d", i, s.Client.Totals[stats.SockRXPackets], cur[stats.SockRXPackets])
		}
		last = cur
	}
	if last[stats.SockRXPackets] == 0 {
		t.Error("no traffic counted while reading")
	}
}
