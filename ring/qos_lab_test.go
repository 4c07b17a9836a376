package ring_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/arrivals"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

// The QoS lab tests measure the scheduler at an independent receiver (a
// kernel socket in the peer namespace) and never by time alone: the
// senders fill their queues while the port limit holds the ring almost
// shut, then the limit opens and every class stays backlogged from what
// is already queued for the whole measured window, however late the
// machine runs the senders or the engine. Shares are counted in
// datagrams of one size, so they are shares of wire bytes.

const qosDgram = 1000

// qosConfig returns the default state with UP n in TC n.
func qosConfig(t *testing.T) qos.Config {
	t.Helper()
	c := qos.Default()
	if err := c.SetPrioTC("0,1,2,3,4,5,6,7"); err != nil {
		t.Fatal(err)
	}
	return c
}

func setQoS(t *testing.T, r *ring.Ring, c qos.Config) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r.SetQoS(&c)
}

// fill queues n datagrams on ep for dst (Send fails the test if the
// queue cannot take them).
func fill(t *testing.T, ep *ring.Endpoint, dst netip.AddrPort, n int) {
	t.Helper()
	b := make([]byte, qosDgram)
	for i := range n {
		if err := ep.Send(b, dst, time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queueing datagram %d of %d: %v", i, n, err)
		}
	}
}

// countFrom reads n datagrams and counts them by source port.
func countFrom(t *testing.T, c *net.UDPConn, n int) map[uint16]int {
	t.Helper()
	got := map[uint16]int{}
	buf := make([]byte, 2048)
	for i := range n {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d of %d: %v (so far %v)", i, n, err, got)
		}
		got[from.Port()]++
	}
	return got
}

// drainQuiet reads until nothing arrives for d and returns the count.
func drainQuiet(c *net.UDPConn, d time.Duration) int {
	buf := make([]byte, 2048)
	n := 0
	for {
		_ = c.SetReadDeadline(time.Now().Add(d))
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			return n
		}
		n++
	}
}

func TestQoSSharesAndStrict(t *testing.T) {
	l := newLab(t, ring.Config{})
	recv := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	_ = recv.SetReadBuffer(4 << 20)
	dst := recv.LocalAddr().(*net.UDPAddr).AddrPort()
	low := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	high := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	o := low.HeaderOptions()
	o.Priority = 0 // UP 0, TC 0
	low.SetHeaderOptions(o)
	o.Priority = 1 // UP 1, TC 1
	high.SetHeaderOptions(o)

	// Resolve the next hop first: a datagram each, unlimited.
	fill(t, low, dst, 1)
	fill(t, high, dst, 1)
	countFrom(t, recv, 2)

	c := qosConfig(t)
	if err := c.SetTSA("ets,ets"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTCBW("30,70"); err != nil {
		t.Fatal(err)
	}
	// shut holds the ring (but for the bucket a new state starts with)
	// and waits until nothing sent under the old state is on its way, so
	// that every datagram counted after it left under the next state.
	sent := 0
	shut := func() {
		t.Helper()
		c.MaxRateKbps = 1
		setQoS(t, l.r, c)
		sent += drainQuiet(recv, 300*time.Millisecond)
	}
	shut()
	const queued = 900 // fits the 1 MiB queues
	fill(t, low, dst, queued)
	fill(t, high, dst, queued)
	shut()

	// ETS 30/70 at 8 Mbit/s over 600 datagrams: TC 1 needs 420 of its
	// 900, TC 0 180: both stay backlogged throughout.
	c.MaxRateKbps = 8000
	setQoS(t, l.r, c)
	const window = 600
	got := countFrom(t, recv, window)
	sent += window
	lowShare := float64(got[low.LocalAddr().Port()]) / window
	t.Logf("ETS 30/70: %v, low share %.3f", got, lowShare)
	if lowShare < 0.27 || lowShare > 0.33 {
		t.Errorf("ETS 30/70: the 30%% class got %.1f%% of the datagrams (%v), want 30%% ±3", 100*lowShare, got)
	}

	// TC 1 strict: it takes everything while it has traffic (at least
	// 900 - 420 - 32 left: the window is 300).
	shut()
	c.TSA[1], c.BW[0], c.MaxRateKbps = qos.Strict, 100, 8000
	setQoS(t, l.r, c)
	got = countFrom(t, recv, 300)
	sent += 300
	if n := got[low.LocalAddr().Port()]; n != 0 {
		t.Errorf("strict TC 1 backlogged: ETS TC 0 still sent %d of 300 (%v)", n, got)
	}
	// And starves nobody once it is idle: everything queued arrives.
	if total := sent + drainQuiet(recv, time.Second); total != 2*queued {
		t.Errorf("received %d datagrams, sent %d", total, 2*queued)
	}
	for tc := range 2 {
		st := l.r.TCStats(tc)
		if p := st.TXPackets.Load(); p != queued+1 {
			t.Errorf("tc %d: %d datagrams counted, want %d", tc, p, queued+1)
		}
		if b := st.TXBytes.Load(); b < uint64(queued*qosDgram) {
			t.Errorf("tc %d: %d wire bytes counted, want over %d", tc, b, queued*qosDgram)
		}
	}
	if h := l.r.TCStats(0).TXHeld.Load(); h == 0 {
		t.Error("the port limit never held TC 0 back")
	}
}

// A class's limit holds over all its sockets, and the forced traffic class
// and TTL reach the wire.
func TestQoSClassLimitAndForcedHeader(t *testing.T) {
	l := newLab(t, ring.Config{})
	hdr := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	recvHeaderFields(t, hdr)
	recv := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	var eps []*ring.Endpoint
	for range 2 {
		ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		o := ep.HeaderOptions()
		o.TOS = 24 // sk_prio 4 through the fixed map: UP 4, TC 4
		o.Priority = uint32(qos.TOSToSkPrio(o.TOS))
		ep.SetHeaderOptions(o)
		eps = append(eps, ep)
	}
	c := qosConfig(t)
	c.RateKbps[4] = 2000 // 2 Mbit/s for TC 4
	c.TrafficClass = int(qos.TOSOfDSCP(46))
	c.TTL = 7
	setQoS(t, l.r, c)

	// Forced fields, as the receiver sees them.
	fill(t, eps[0], hdr.LocalAddr().(*net.UDPAddr).AddrPort(), 1)
	buf, oob := make([]byte, 2048), make([]byte, 256)
	_ = hdr.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, oobn, _, _, err := hdr.ReadMsgUDPAddrPort(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if tos, ttl := headerFields(t, oob[:oobn]); tos != 0xb8 || ttl != 7 {
		t.Errorf("forced traffic class 184 (DSCP 46 × 4) and TTL 7: received ToS %d, TTL %d", tos, ttl)
	}

	// The limit, from the kernel's receive times: however late the
	// machine runs the engine or this test, no stretch of arrivals may
	// carry more than the rate plus the bucket, give or take a few
	// datagrams whose kick was delayed after their decision (8 allowed:
	// a limiter 5% too fast exceeds that over these 1.2 s).
	const each = 150
	rec, err := arrivals.Record(recv, 2*each)
	if err != nil {
		t.Fatal(err)
	}
	dst := recv.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, ep := range eps {
		fill(t, ep, dst, each)
	}
	for deadline := time.Now().Add(20 * time.Second); rec.Count() < 2*each && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	arr, err := rec.Stop()
	if err != nil || len(arr) != 2*each {
		t.Fatalf("received %d of %d datagrams: %v", len(arr), 2*each, err)
	}
	const rate = 2e6
	excess := arrivals.MaxExcess(arr, arrivals.WireOverhead4, rate)
	bucket := float64(16 << 10)
	span := time.Duration(arr[len(arr)-1].T - arr[0].T)
	avg := float64(2*each*(qosDgram+arrivals.WireOverhead4)) * 8 / span.Seconds()
	t.Logf("TC 4 limited to 2 Mbit/s: %d datagrams in %v (%.2f Mbit/s with the first bucket), largest burst beyond the rate %.0f bytes (bucket %.0f)",
		len(arr), span, avg/1e6, excess, bucket)
	if excess > bucket+8*(qosDgram+arrivals.WireOverhead4) {
		t.Errorf("TC 4 limited to 2 Mbit/s: %.0f bytes beyond the rate in one stretch, more than its %.0f-byte bucket", excess, bucket)
	}
	// Slower is only the machine's doing; 10 times slower is a bug.
	if avg < rate/10 {
		t.Errorf("TC 4 limited to 2 Mbit/s sent at only %.2f Mbit/s", avg/1e6)
	}
	if p := l.r.TCStats(4).TXPackets.Load(); p != 2*each+1 {
		t.Errorf("tc 4 counted %d datagrams, want %d", p, 2*each+1)
	}
	if h := l.r.TCStats(4).TXHeld.Load(); h == 0 {
		t.Error("the class limit never held TC 4 back")
	}
}

// recvHeaderFields asks for the ToS and TTL of received datagrams.
func recvHeaderFields(t *testing.T, c *net.UDPConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1); serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
		}
	})
	if err != nil || serr != nil {
		t.Fatalf("IP_RECVTOS/IP_RECVTTL: %v %v", err, serr)
	}
}

// headerFields returns the ToS and TTL from a datagram's control messages.
func headerFields(t *testing.T, oob []byte) (tos, ttl int) {
	t.Helper()
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		t.Fatal(err)
	}
	tos, ttl = -1, -1
	for _, m := range msgs {
		if m.Header.Level != unix.IPPROTO_IP || len(m.Data) == 0 {
			continue
		}
		switch m.Header.Type {
		case unix.IP_TOS:
			tos = int(m.Data[0])
		case unix.IP_TTL:
			ttl = int(m.Data[0])
		}
	}
	return tos, ttl
}

// Received datagrams are counted in the TC the trust state gives them:
// their DSCP through dscp2prio when trusting DSCP, priority 0 (untagged)
// when trusting PCP.
func TestQoSIngressClass(t *testing.T) {
	l := newLab(t, ring.Config{})
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	sender := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	rc, err := sender.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, int(qos.TOSOfDSCP(46)))
	}); err != nil || serr != nil {
		t.Fatalf("IP_TOS: %v %v", err, serr)
	}
	c := qosConfig(t)
	c.Trust = qos.TrustDSCP
	if err := c.SetDSCP2Prio("set,46,6"); err != nil {
		t.Fatal(err)
	}
	setQoS(t, l.r, c)
	// The engine applies a state from its next iteration on: the
	// datagram after one it delivered is classified by the new state.
	exchange := func(n int) {
		t.Helper()
		buf := make([]byte, 2048)
		for i := range n {
			if _, err := sender.WriteToUDPAddrPort(make([]byte, 100), ep.LocalAddr()); err != nil {
				t.Fatal(err)
			}
			if _, _, err := ep.Recv(buf, time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("datagram %d: %v", i, err)
			}
		}
	}
	exchange(1)
	before := l.r.TCStats(6).RXPackets.Load()
	exchange(10)
	if got := l.r.TCStats(6).RXPackets.Load() - before; got != 10 {
		t.Errorf("trust dscp, EF mapped to priority 6: TC 6 counted %d of 10", got)
	}
	c.Trust = qos.TrustPCP
	setQoS(t, l.r, c)
	exchange(1)
	before = l.r.TCStats(0).RXPackets.Load()
	exchange(5)
	if got := l.r.TCStats(0).RXPackets.Load() - before; got != 5 {
		t.Errorf("trust pcp, untagged: TC 0 counted %d of 5", got)
	}
}
