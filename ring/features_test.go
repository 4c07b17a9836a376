package ring_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/ring"
)

// multicastSender is a kernel UDP socket in ns that sends multicast out of
// ifindex.
func multicastSender(t *testing.T, ns *netlab.NS, ifindex int, src netip.AddrPort) *net.UDPConn {
	t.Helper()
	c := ns.ListenUDP(t, src)
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptIPMreqn(int(fd), unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifindex)})
	}); err != nil || serr != nil {
		t.Fatalf("IP_MULTICAST_IF: %v %v", err, serr)
	}
	return c
}

func expectDatagrams(t *testing.T, ep *ring.Endpoint, want [][]byte) {
	t.Helper()
	buf := make([]byte, 2048)
	for i, w := range want {
		n, _, err := ep.Recv(buf, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatalf("%v: datagram %d: %v", ep.LocalAddr(), i, err)
		}
		if !bytes.Equal(buf[:n], w) {
			t.Fatalf("%v: datagram %d: got %q want %q", ep.LocalAddr(), i, buf[:n], w)
		}
	}
}

func expectNothing(t *testing.T, ep *ring.Endpoint) {
	t.Helper()
	if n, from, err := ep.Recv(make([]byte, 2048), time.Now().Add(200*time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%v: unexpected datagram (%d bytes from %v, %v)", ep.LocalAddr(), n, from, err)
	}
}

func TestMulticast(t *testing.T) {
	l := newLab(t, ring.Config{})
	group := netip.MustParseAddr("239.1.2.3")
	ep1, err := l.r.Bind(netip.AddrPortFrom(netip.IPv4Unspecified(), 0), ring.BindOptions{ReuseAddr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ep1.Close()
	port := ep1.LocalAddr().Port()
	ep2, err := l.r.Bind(netip.AddrPortFrom(netip.IPv4Unspecified(), port), ring.BindOptions{ReuseAddr: true})
	if err != nil {
		t.Fatalf("second reuse-address bind: %v", err)
	}
	defer ep2.Close()
	for _, ep := range []*ring.Endpoint{ep1, ep2} {
		if err := ep.JoinGroup(group, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel joined the group on the interface (IGMP goes out).
	var igmp []byte
	if err := l.p.A.NS.Do(func() error {
		var err error
		igmp, err = os.ReadFile("/proc/thread-self/net/igmp")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(igmp), "030201EF") { // 239.1.2.3, little-endian hex
		t.Errorf("kernel has not joined %v:\n%s", group, igmp)
	}

	sender := multicastSender(t, l.p.B.NS, l.p.B.Index, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	dst := netip.AddrPortFrom(group, port)
	var want [][]byte
	for i := 0; i < 20; i++ {
		m := payload(i, 100+i)
		want = append(want, m)
		if _, err := sender.WriteToUDPAddrPort(m, dst); err != nil {
			t.Fatal(err)
		}
	}
	expectDatagrams(t, ep1, want)
	expectDatagrams(t, ep2, want)

	if err := ep2.LeaveGroup(group, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if err := ep2.LeaveGroup(group, netip.Addr{}); !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatalf("second leave: %v, want EADDRNOTAVAIL", err)
	}
	if _, err := sender.WriteToUDPAddrPort([]byte("after leave"), dst); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, ep1, [][]byte{[]byte("after leave")})
	expectNothing(t, ep2)

	// Unicast to the shared port goes to one endpoint only: the newest.
	uni := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	if _, err := uni.WriteToUDPAddrPort([]byte("unicast"), netip.AddrPortFrom(l.p.A.Addr4(), port)); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, ep2, [][]byte{[]byte("unicast")})
	expectNothing(t, ep1)

	// Loopback: a local sender's multicast reaches local members.
	local := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err := local.Send([]byte("loop"), dst, time.Time{}); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, ep1, [][]byte{[]byte("loop")})

	// Close releases the membership and the steering entry.
	if err := ep1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ep2.Close(); err != nil {
		t.Fatal(err)
	}
	flows, err := l.r.Flows()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Dst.Port() == port {
			t.Errorf("steering entry %v left after close", f)
		}
	}
}

// TestBindGroupAddress: a socket bound to the group address itself receives
// the group once it joins, and only the group.
func TestBindGroupAddress(t *testing.T) {
	l := newLab(t, ring.Config{})
	group := netip.MustParseAddr("239.9.9.9")
	ep, err := l.r.Bind(netip.AddrPortFrom(group, 0), ring.BindOptions{})
	if err != nil {
		t.Fatalf("bind a group address: %v", err)
	}
	defer ep.Close()
	if err := ep.JoinGroup(group, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	sender := multicastSender(t, l.p.B.NS, l.p.B.Index, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	if _, err := sender.WriteToUDPAddrPort([]byte("to the group"), netip.AddrPortFrom(group, ep.LocalAddr().Port())); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, ep, [][]byte{[]byte("to the group")})
	expectNothing(t, ep) // exactly one copy
}

func TestSourceSpecificMulticast(t *testing.T) {
	l := newLab(t, ring.Config{})
	// A second address in B is the source we do not want.
	other := netip.PrefixFrom(l.p.B.Addr4().Next().Next(), 24)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := l.p.B.NS.Command(ctx, "ip", "addr", "add", other.String(), "dev", l.p.B.Name).CombinedOutput(); err != nil {
		t.Fatalf("add address: %v: %s", err, out)
	}
	group := netip.MustParseAddr("232.1.1.1")
	ep := l.bind(t, netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	if err := ep.JoinGroup(group, l.p.B.Addr4()); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(group, ep.LocalAddr().Port())
	wanted := multicastSender(t, l.p.B.NS, l.p.B.Index, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	unwanted := multicastSender(t, l.p.B.NS, l.p.B.Index, netip.AddrPortFrom(other.Addr(), 0))
	if _, err := unwanted.WriteToUDPAddrPort([]byte("unwanted"), dst); err != nil {
		t.Fatal(err)
	}
	if _, err := wanted.WriteToUDPAddrPort([]byte("wanted"), dst); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, ep, [][]byte{[]byte("wanted")})
	expectNothing(t, ep)
	if err := ep.JoinGroup(netip.MustParseAddr("10.1.1.1"), netip.Addr{}); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("join a unicast address: %v, want EINVAL", err)
	}
}

// TestHeaderOptions: TTL and TOS set on the endpoint appear on the wire.
func TestHeaderOptions(t *testing.T) {
	l := newLab(t, ring.Config{})
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	o := ep.HeaderOptions()
	if o != ring.DefaultHeaderOptions {
		t.Fatalf("default options %+v", o)
	}
	o.TTL, o.TOS = 7, 0x28
	ep.SetHeaderOptions(o)
	recv := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	raw, _ := recv.SyscallConn()
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
	})
	if err := ep.Send([]byte("ttl"), recv.LocalAddr().(*net.UDPAddr).AddrPort(), time.Time{}); err != nil {
		t.Fatal(err)
	}
	_ = recv.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf, oob := make([]byte, 64), make([]byte, 256)
	_, oobn, _, _, err := recv.ReadMsgUDPAddrPort(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	got := map[int32]byte{}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && len(m.Data) > 0 {
			got[m.Header.Type] = m.Data[0]
		}
	}
	if got[unix.IP_TTL] != 7 || got[unix.IP_TOS] != 0x28 {
		t.Fatalf("received TTL %d TOS %#x, want 7 and 0x28", got[unix.IP_TTL], got[unix.IP_TOS])
	}
}

// TestCallerQueues binds over queues in a session memory (a sealed memfd),
// with the user side on a second mapping of it, as the daemon and a client
// do: TX announced through the lane bitmap and the doorbell, RX woken
// through the events bitmap and the client eventfd. A datagram the client
// queued before the bind (announced while the engine knew no endpoint for
// the slot) goes out once the bind is done, though Bind visits a new
// endpoint only when its slot was announced.
func TestCallerQueues(t *testing.T) {
	t.Run("bind first", func(t *testing.T) { testCallerQueues(t, false, false) })
	t.Run("send first", func(t *testing.T) { testCallerQueues(t, true, false) })
	// A lane without a doorbell of its own, as a session adopted from a
	// daemon without lane doorbells has: its client rings the ring's.
	t.Run("ring doorbell", func(t *testing.T) { testCallerQueues(t, false, true) })
}

func testCallerQueues(t *testing.T, sendFirst, ringDoorbell bool) {
	l := newLab(t, ring.Config{})
	const capacity = 1 << 16
	lay, err := shmsess.NewLayout(64, 1, 16*shmsess.SocketSpan(capacity))
	if err != nil {
		t.Fatal(err)
	}
	fd, mem, err := shmq.CreateMemfd("test-session", int(lay.Size))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer shmq.Unmap(mem)
	sess, err := shmsess.Init(mem, lay)
	if err != nil {
		t.Fatal(err)
	}
	const slot = 5
	txOff := lay.ArenaOffset + 3*shmsess.SocketSpan(capacity)
	rxOff := txOff + shmsess.QueueSpan(capacity)
	txq, _ := sess.Queue(uint64(txOff), capacity)
	rxq, _ := sess.Queue(uint64(rxOff), capacity)
	// Formatted as the daemon does: the TX queue's consumer (the engine)
	// armed from the start.
	img, _ := shmq.HeaderImage(capacity, true)
	copy(txq, img)
	if _, err := shmq.Init(rxq, capacity); err != nil {
		t.Fatal(err)
	}
	clientWake, _ := shmq.NewWaiter()
	laneBell, err := shmq.NewBell()
	if err != nil {
		t.Fatal(err)
	}
	defer laneBell.Close()
	laneOwn := laneBell
	if ringDoorbell {
		laneOwn = nil
	}
	lane, err := l.r.AddLane(sess.Lane(0), lay.MaxSlots, laneOwn)
	if err != nil {
		t.Fatal(err)
	}
	defer lane.Close()

	// The "client": its own mapping and copies of the eventfds.
	cmem, err := shmq.MapMemfd(fd, int(lay.Size))
	if err != nil {
		t.Fatal(err)
	}
	defer shmq.Unmap(cmem)
	csess, err := shmsess.Attach(cmem, lay.MaxSlots, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctxm, _ := csess.Queue(uint64(txOff), capacity)
	crxm, _ := csess.Queue(uint64(rxOff), capacity)
	ctx, _ := shmq.Attach(ctxm)
	crx, _ := shmq.Attach(crxm)
	dup := func(w *shmq.Waiter) *shmq.Waiter {
		nfd, err := unix.Dup(w.FD())
		if err != nil {
			t.Fatal(err)
		}
		cw, err := shmq.NewWaiterFD(nfd)
		if err != nil {
			t.Fatal(err)
		}
		return cw
	}
	bfd, err := unix.Dup(laneBell.FD())
	if ringDoorbell {
		bfd, err = unix.Dup(l.r.Doorbell().FD())
	}
	if err != nil {
		t.Fatal(err)
	}
	bell, err := shmq.NewBellFD(bfd)
	if err != nil {
		t.Fatal(err)
	}
	defer bell.Close()
	disp := shmsess.NewDispatcher(csess, dup(clientWake))
	defer disp.Close()
	rxSig, txSig := shmq.NewSignal(), shmq.NewSignal()
	disp.Register(slot, multi{rxSig, txSig})
	user := sockq.New(ctx, crx, rxSig, txSig, shmsess.NewAnnouncer(csess, 0, slot, bell), shmq.Policy{})
	defer user.Close()

	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	buf := make([]byte, 64)
	if sendFirst {
		if _, err := user.SendBatch([][]byte{[]byte("before bind")}, peer.LocalAddr().(*net.UDPAddr).AddrPort(), time.Time{}); err != nil {
			t.Fatal(err)
		}
		// Let the engine drain the announcement, finding no endpoint.
		for deadline := time.Now().Add(10 * time.Second); sess.Lane(0).Pending(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the engine did not drain the announcement made before the bind")
			}
		}
	}
	ep, err := l.r.Bind(netip.AddrPortFrom(l.p.A.Addr4(), 0), ring.BindOptions{Queues: &ring.Queues{TX: txq, RX: rxq, QueueBytes: capacity,
		Wake: ring.SessionWaker(sess, slot, clientWake), Lane: lane, Slot: slot}})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if err := ep.Send([]byte("x"), netip.AddrPortFrom(l.p.B.Addr4(), 9), time.Time{}); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Fatalf("in-process send on a client endpoint: %v", err)
	}
	if sendFirst {
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != "before bind" || from.Port() != ep.LocalAddr().Port() {
			t.Fatalf("datagram queued before the bind: kernel peer got %q from %v: %v", buf[:n], from, err)
		}
	}
	for i := range 3 {
		// Each round the engine found the queue empty and sleeps: the send
		// must announce the socket again.
		time.Sleep(20 * time.Millisecond)
		if _, err := user.SendBatch([][]byte{[]byte("from client")}, peer.LocalAddr().(*net.UDPAddr).AddrPort(), time.Time{}); err != nil {
			t.Fatal(err)
		}
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != "from client" || from.Port() != ep.LocalAddr().Port() {
			t.Fatalf("round %d: kernel peer got %q from %v: %v", i, buf[:n], from, err)
		}
		if _, err := peer.WriteToUDPAddrPort([]byte("to client"), ep.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		msgs := []sockq.Message{{Buf: make([]byte, 64)}}
		if _, err := user.RecvBatch(msgs, time.Now().Add(5*time.Second)); err != nil || string(msgs[0].Buf[:msgs[0].N]) != "to client" {
			t.Fatalf("round %d: client received %q: %v", i, msgs[0].Buf[:msgs[0].N], err)
		}
	}
}

type multi []*shmq.Signal

func (m multi) Wake() error {
	for _, s := range m {
		_ = s.Wake()
	}
	return nil
}
