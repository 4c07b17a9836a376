package daemon

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/route"
)

// scaleSockets is how many sockets each echo-many child opens and binds.
const scaleSockets = 1000

// clientsPerAddr echo-many children bind to one address: the kernel's
// ephemeral port range (32768–60999 by default) holds 28,232 ports per
// address, so 100,000 sockets need several (see scaleAddrs).
const clientsPerAddr = 20

// scaleAddrs returns the addresses of A the clients bind to, client i to
// the (i/clientsPerAddr)th: A's own, then more added for the test.
func scaleAddrs(t *testing.T, l *lab, clients int) []netip.Addr {
	t.Helper()
	addrs := []netip.Addr{l.p.A.Addr4()}
	for len(addrs)*clientsPerAddr < clients {
		addrs = append(addrs, l.p.A.AddAddr4(t, byte(100+len(addrs))))
	}
	return addrs
}

// openFDs counts this process's descriptors (the daemon runs in it).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// sessionMappings counts this process's mappings of session memory.
func sessionMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "bypassd-session-")
}

// idleSocketRSS bounds the daemon memory one idle bound socket may cost
// (issue 20's target is 4 KiB; 3.7 KiB measured with its stats file
// block, the rest is headroom): its queue pages must stay out of the daemon, and
// its bookkeeping small.
const idleSocketRSS = 6 << 10

// residentBytes returns this process's resident memory (the daemon runs
// in it) after returning freed heap to the kernel, so that two readings
// compare live memory, not the collector's timing.
func residentBytes(t *testing.T) int64 {
	t.Helper()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// pingPong sends n datagrams from s to peer and reads each echo back,
// returning the ring's endpoint visits per datagram.
func pingPong(t *testing.T, r *ring.Ring, s *clientSocket, peer *net.UDPConn, n int) float64 {
	t.Helper()
	dst := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	st := r.Stats()
	v0, tx0, rx0 := st.TXVisits.Load(), st.TXPackets.Load(), st.RXPackets.Load()
	buf := make([]byte, 64)
	msgs := []sockq.Message{{Buf: make([]byte, 64)}}
	deadline := time.Now().Add(30 * time.Second)
	for i := range n {
		out := []byte("ping " + strconv.Itoa(i))
		if k, err := s.conn.SendBatch([][]byte{out}, dst, deadline); k != 1 || err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		_ = peer.SetReadDeadline(deadline)
		k, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:k], out) {
			t.Fatalf("kernel peer, datagram %d: %q %v", i, buf[:k], err)
		}
		if _, err := peer.WriteToUDPAddrPort(buf[:k], from); err != nil {
			t.Fatal(err)
		}
		if k, err := s.conn.RecvBatch(msgs, deadline); k != 1 || err != nil || !bytes.Equal(msgs[0].Buf[:msgs[0].N], out) {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	if d := st.TXPackets.Load() - tx0; d < uint64(n) {
		t.Fatalf("ring sent %d datagrams for %d: not the fast path", d, n)
	}
	if d := st.RXPackets.Load() - rx0; d < uint64(n) {
		t.Fatalf("ring received %d datagrams for %d: not the fast path", d, n)
	}
	return float64(st.TXVisits.Load()-v0) / float64(n)
}

// TestSocketsAtScale: 20 client processes with 1,000 bound sockets each.
// Every socket gets one datagram from a kernel sender and answers it from
// its own address and port; the daemon's descriptors grow per client (connection,
// session memfd, client eventfd), not per socket (port reservations are
// parked in io_uring file tables, one descriptor per 4,096), and 1,000
// more unbound sockets cost none; one busy
// socket's engine work per datagram does not grow with the idle ones; a
// killed client's 1,000 sockets are all released (flows, XDP map entries,
// endpoints, session memory).
//
// make test runs it without the race detector (which skips it);
// make scale runs it with BYPASSD_SCALE_CLIENTS=100 (100,000 sockets on
// five addresses, see clientsPerAddr).
func TestSocketsAtScale(t *testing.T) {
	if raceEnabled {
		t.Skip("20,000 sockets under the race detector take over ten minutes: make test runs this test in a build without it")
	}
	clients := 20
	if v := os.Getenv("BYPASSD_SCALE_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BYPASSD_SCALE_CLIENTS=%q: want a positive number of client processes", v)
		}
		clients = n
	}
	if err := route.ParkStatus(); err != nil {
		t.Fatalf("port reservations cannot be parked in io_uring here, so 20,000 bound sockets exceed RLIMIT_NOFILE: %v", err)
	}
	l := newLab(t, config.Config{QueueBytes: 4096, MaxSockets: 2 * scaleSockets})
	r := l.d.Rings()[0]
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	active := helloClient(t, l)
	s := openSocket(t, active, unix.AF_INET)
	if _, err := active.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false); err != nil {
		t.Fatal(err)
	}
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	const rounds = 200
	pingPong(t, r, s, peer, 20) // next hop resolved, caches warm
	visits0 := pingPong(t, r, s, peer, rounds)

	// Unbound sockets cost the daemon no descriptor at all.
	fdsIdle := openFDs(t)
	for i := range scaleSockets {
		if _, err := active.open(unix.AF_INET, 4096); err != nil {
			t.Fatalf("open unbound socket %d: %v", i, err)
		}
	}
	if grew := openFDs(t) - fdsIdle; grew > 2 {
		t.Errorf("%d unbound sockets cost the daemon %d descriptors", scaleSockets, grew)
	}

	addrs := scaleAddrs(t, l, clients)
	fds0 := openFDs(t)
	rss0 := residentBytes(t)
	start := time.Now()
	children := make([]*child, clients)
	for i := range children {
		env := []string{envSocket + "=" + l.cfg.SocketPath, envAddr + "=" + addrs[i/clientsPerAddr].String()}
		children[i] = startChild(t, self, "echo-many", env, nil)
	}
	seen := map[netip.AddrPort]bool{}
	var ports []netip.AddrPort
	for i, ch := range children {
		for {
			line := ch.line(t)
			if line == "ready" {
				break
			}
			p, err := strconv.ParseUint(line, 10, 16)
			if err != nil {
				t.Fatalf("child: %q (stderr: %s)", line, ch.err.String())
			}
			ap := netip.AddrPortFrom(addrs[i/clientsPerAddr], uint16(p))
			if seen[ap] {
				t.Fatalf("%v bound twice", ap)
			}
			seen[ap] = true
			ports = append(ports, ap)
		}
	}
	t.Logf("%d clients opened and bound %d sockets on %d addresses in %v", clients, len(ports), len(addrs), time.Since(start))
	if len(ports) != clients*scaleSockets {
		t.Fatalf("%d bound sockets, want %d", len(ports), clients*scaleSockets)
	}
	if n := len(l.flows(t)); n != len(ports)+1 {
		t.Fatalf("%d flows for %d bound sockets", n, len(ports)+1)
	}
	fds1 := openFDs(t)
	t.Logf("daemon descriptors: %d before, %d with %d clients and %d bound sockets", fds0, fds1, clients, len(ports))
	// Memory follows use: an idle bound socket costs the daemon its
	// bookkeeping, not its queues.
	rss1 := residentBytes(t)
	perSocket := (rss1 - rss0) / int64(len(ports))
	t.Logf("daemon resident memory: %d MiB before, %d MiB with %d bound sockets: %d bytes per socket", rss0>>20, rss1>>20, len(ports), perSocket)
	if perSocket > idleSocketRSS {
		t.Errorf("an idle bound socket costs the daemon %d bytes of resident memory, more than %d", perSocket, idleSocketRSS)
	}

	// The busy socket's engine work per datagram is what it was.
	visits1 := pingPong(t, r, s, peer, rounds)
	t.Logf("endpoint visits per datagram: %.2f with no idle sockets, %.2f with %d", visits0, visits1, len(ports)+scaleSockets)
	if visits1 > 2*visits0+1 {
		t.Errorf("endpoint visits per datagram grew from %.2f to %.2f with %d idle sockets", visits0, visits1, len(ports))
	}

	// Every socket echoes one datagram from the kernel, from its port. A
	// window of datagrams is outstanding at a time: a burst of 20,000
	// would overflow the lab's receive ring, which is not what this test
	// is about.
	sender := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	st := r.Stats()
	rx0, tx0 := st.RXPackets.Load(), st.TXPackets.Load()
	want := map[netip.AddrPort]bool{}
	buf := make([]byte, 64)
	const window = 32
	next := 0
	echoStart := time.Now()
	for next < len(ports) || len(want) > 0 {
		for ; next < len(ports) && len(want) < window; next++ {
			p := ports[next]
			want[p] = true
			if _, err := sender.WriteToUDPAddrPort([]byte(fmt.Sprintf("to %v", p)), p); err != nil {
				t.Fatal(err)
			}
		}
		_ = sender.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, from, err := sender.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("%d of %d sockets did not answer (%d outstanding): %v", len(ports)-next+len(want), len(ports), len(want), err)
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		if string(buf[:n]) != fmt.Sprintf("to %v", from) || !want[from] {
			t.Fatalf("answer %q from %v", buf[:n], from)
		}
		delete(want, from)
	}
	if drx, dtx := st.RXPackets.Load()-rx0, st.TXPackets.Load()-tx0; drx < uint64(len(ports)) || dtx < uint64(len(ports)) {
		t.Fatalf("ring received %d and sent %d for %d echoes: not the fast path", drx, dtx, len(ports))
	}
	t.Logf("%d sockets each received and answered one datagram in %v", len(ports), time.Since(echoStart))

	// A killed client's sockets all go: flows, XDP map entries,
	// endpoints, session memory.
	flows, eps, maps := len(l.flows(t)), r.Endpoints(), sessionMappings(t)
	if err := children[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = children[0].cmd.Wait()
	killed := time.Now()
	// Complete, not fast, on a loaded machine: each endpoint's flow goes
	// from the XDP map and the standby TAP path's tc filters (a netlink
	// round trip each). Listing 20,000 flows is not cheap either: look
	// every 100 ms.
	const releaseWithin = 60 * time.Second
	for len(l.flows(t)) > flows-scaleSockets && time.Since(killed) < releaseWithin {
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(l.flows(t)); n != flows-scaleSockets {
		t.Fatalf("%d flows after killing a client with %d bound sockets, want %d", n, scaleSockets, flows-scaleSockets)
	}
	all, err := r.Program().Flows()
	if err != nil || len(all) != flows-scaleSockets {
		t.Fatalf("XDP flow map after kill -9: %d entries, %v; want %d", len(all), err, flows-scaleSockets)
	}
	for r.Endpoints() > eps-scaleSockets && time.Since(killed) < releaseWithin {
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.Endpoints(); n != eps-scaleSockets {
		t.Fatalf("%d endpoints after kill -9, want %d", n, eps-scaleSockets)
	}
	for sessionMappings(t) > maps-1 && time.Since(killed) < releaseWithin {
		time.Sleep(10 * time.Millisecond)
	}
	if n := sessionMappings(t); n != maps-1 {
		t.Fatalf("%d session memory mappings after kill -9, want %d", n, maps-1)
	}
	t.Logf("a client with %d sockets released %v after kill -9", scaleSockets, time.Since(killed))
}

// TestFlowMapFull: a bind that needs an entry in a full flow map fails with
// ENOSPC and a message that names --max-flows, the ring counts it, nothing
// else breaks, and the entry a closed socket frees is used again.
func TestFlowMapFull(t *testing.T) {
	const maxFlows = 8
	l := newLab(t, config.Config{MaxFlows: maxFlows})
	r := l.d.Rings()[0]
	c := helloClient(t, l)
	addr := netip.AddrPortFrom(l.p.A.Addr4(), 0)
	var socks []*clientSocket
	for range maxFlows {
		s := openSocket(t, c, unix.AF_INET)
		if _, err := c.bind(s, addr, false); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	extra := openSocket(t, c, unix.AF_INET)
	resp, err := c.call(ctlproto.CodeBind, extra.id, ctlproto.Bind{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	if resp.h.Status != unix.ENOSPC {
		t.Fatalf("bind with a full flow map: status %v, want ENOSPC", resp.h.Status)
	}
	if n := r.Stats().FlowsFull.Load(); n != 1 {
		t.Errorf("flows_full %d, want 1", n)
	}
	// The refused socket is intact: it binds once an entry is free.
	if _, err := c.ok(ctlproto.CodeClose, socks[0].id, ctlproto.Empty{}); err != nil {
		t.Fatal(err)
	}
	socks[0].close()
	got, err := c.bind(extra, addr, false)
	if err != nil {
		t.Fatalf("bind after a socket closed: %v", err)
	}
	if n := len(l.flows(t)); n != maxFlows {
		t.Fatalf("%d flows, want %d", n, maxFlows)
	}
	// And it carries traffic.
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	if _, err := peer.WriteToUDPAddrPort([]byte("hi"), got); err != nil {
		t.Fatal(err)
	}
	msgs := []sockq.Message{{Buf: make([]byte, 64)}}
	if n, err := extra.conn.RecvBatch(msgs, time.Now().Add(10*time.Second)); n != 1 || err != nil || string(msgs[0].Buf[:msgs[0].N]) != "hi" {
		t.Fatalf("receive on the socket bound after the map was full: %d %v", n, err)
	}
}
