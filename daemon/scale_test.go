package daemon

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/ring"
)

// The idle-many child: sockets opened, and how many of them are bound.
const (
	idleOpen  = 5000
	idleBound = 250
)

// openFDs counts this process's descriptors (the daemon runs in it).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
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

// TestIdleSocketsAtScale: 20,000 sockets of four client processes (1,000
// of them bound and echoing) cost the daemon descriptors per client and
// per bound socket (its port reservation), none per socket otherwise; the
// engine's work for one busy socket does not grow with them; every bound
// socket gets its datagram and answers from the right port; a killed
// client's sockets are all released.
func TestIdleSocketsAtScale(t *testing.T) {
	const clients = 4
	l := newLab(t, Config{QueueBytes: 4096, MaxSockets: idleOpen})
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
	fds0 := openFDs(t)

	start := time.Now()
	env := []string{envSocket + "=" + l.cfg.SocketPath, envAddr + "=" + l.p.A.Addr4().String()}
	children := make([]*child, clients)
	var ports []uint16
	for i := range children {
		children[i] = startChild(t, self, "idle-many", env, nil)
	}
	for _, ch := range children {
		for {
			line := ch.line(t)
			if line == "ready" {
				break
			}
			p, err := strconv.Atoi(line)
			if err != nil {
				t.Fatalf("child: %q (stderr: %s)", line, ch.err.String())
			}
			ports = append(ports, uint16(p))
		}
	}
	t.Logf("%d clients opened %d sockets (%d bound) in %v", clients, clients*idleOpen, len(ports), time.Since(start))
	if len(ports) != clients*idleBound {
		t.Fatalf("%d bound sockets, want %d", len(ports), clients*idleBound)
	}
	fds1 := openFDs(t)
	// Per client: its connection, session memfd and client eventfd; per
	// bound socket: its port reservation; nothing per socket.
	if grew, most := fds1-fds0, clients*3+len(ports)+16; grew > most {
		t.Errorf("daemon descriptors grew by %d for %d clients with %d sockets (%d bound); want at most %d", grew, clients, clients*idleOpen, len(ports), most)
	}
	t.Logf("daemon descriptors: %d before, %d with %d idle sockets", fds0, fds1, clients*idleOpen)

	// The busy socket's engine work per datagram is what it was.
	visits1 := pingPong(t, r, s, peer, rounds)
	t.Logf("endpoint visits per datagram: %.2f with no idle sockets, %.2f with %d", visits0, visits1, clients*idleOpen)
	if visits1 > 2*visits0+1 {
		t.Errorf("endpoint visits per datagram grew from %.2f to %.2f with %d idle sockets", visits0, visits1, clients*idleOpen)
	}

	// Every bound socket echoes one datagram from the kernel, from its
	// port. At most a window of datagrams is outstanding: a burst of a
	// thousand would overflow the lab ring's receive ring, which is not
	// what this test is about.
	sender := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	want := map[uint16]bool{}
	buf := make([]byte, 64)
	const window = 16
	next := 0
	_ = sender.SetReadDeadline(time.Now().Add(30 * time.Second))
	for next < len(ports) || len(want) > 0 {
		for ; next < len(ports) && len(want) < window; next++ {
			p := ports[next]
			want[p] = true
			if _, err := sender.WriteToUDPAddrPort([]byte(fmt.Sprintf("to %d", p)), netip.AddrPortFrom(l.p.A.Addr4(), p)); err != nil {
				t.Fatal(err)
			}
		}
		n, from, err := sender.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("%d of %d sockets did not answer (%d outstanding): %v", len(ports)-next+len(want), len(ports), len(want), err)
		}
		if string(buf[:n]) != fmt.Sprintf("to %d", from.Port()) || !want[from.Port()] {
			t.Fatalf("answer %q from port %d", buf[:n], from.Port())
		}
		delete(want, from.Port())
	}

	// A killed client's sockets all go.
	flows := len(l.flows(t))
	if err := children[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = children[0].cmd.Wait()
	killed := time.Now()
	for len(l.flows(t)) > flows-idleBound && time.Since(killed) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(l.flows(t)); n != flows-idleBound {
		t.Fatalf("%d flows after killing a client with %d bound sockets, want %d", n, idleBound, flows-idleBound)
	}
	t.Logf("a client with %d sockets released %v after kill -9", idleOpen, time.Since(killed))
}
