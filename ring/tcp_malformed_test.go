package ring_test

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// badSegment is a crafted TCP segment: its options (a multiple of 4
// bytes), data offset (0: the right one), payload and whether its
// checksum is broken; drop says the stack must drop it whole.
type badSegment struct {
	name    string
	opts    []byte
	doff    int
	payload []byte
	badSum  bool
	drop    bool
}

// badSegments are malformed options (handled as Linux does: parsing stops,
// the segment counts) and malformed headers (dropped, with the payload a
// stream must never see).
func badSegments() []badSegment {
	evil := []byte("EVIL")
	return []badSegment{
		{name: "option length 0", opts: []byte{30, 0, 1, 1}},
		{name: "option length 1", opts: []byte{30, 1, 1, 1}},
		{name: "option past the header", opts: []byte{30, 40, 0, 0}},
		{name: "truncated MSS", opts: []byte{1, 1, 2, 4}},
		{name: "MSS of length 3", opts: []byte{2, 3, 5, 0}},
		{name: "truncated window scale", opts: []byte{1, 1, 1, 3}},
		{name: "window scale of length 2", opts: []byte{3, 2, 1, 0}},
		{name: "truncated SACK-permitted", opts: []byte{1, 1, 1, 4}},
		{name: "SACK-permitted of length 3", opts: []byte{4, 3, 0, 0}},
		{name: "truncated timestamps", opts: []byte{8, 10, 0, 0, 0, 1, 0, 0}},
		{name: "timestamps of length 6", opts: []byte{8, 6, 0, 0, 0, 1, 0, 0}},
		{name: "SACK of length 7", opts: []byte{5, 7, 0, 0, 0, 1, 0, 0}},
		{name: "truncated SACK", opts: []byte{1, 1, 5, 10}},
		{name: "data offset 4", doff: 4, payload: evil, drop: true},
		{name: "data offset 0", doff: 0x10, payload: evil, drop: true}, // 0x10: written as 0
		{name: "data offset past the segment", doff: 15, payload: evil, drop: true},
		{name: "bad checksum", payload: evil, badSum: true, drop: true},
	}
}

// build makes the segment from src:sport to dst:dport.
func (b badSegment) build(src, dst netip.AddrPort, seq, ack uint32, flags byte) []byte {
	seg := make([]byte, 20+len(b.opts)+len(b.payload))
	binary.BigEndian.PutUint16(seg[0:], src.Port())
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], seq)
	binary.BigEndian.PutUint32(seg[8:], ack)
	doff := (20 + len(b.opts)) / 4
	switch {
	case b.doff == 0x10:
		doff = 0
	case b.doff != 0:
		doff = b.doff
	}
	seg[12] = byte(doff) << 4
	seg[13] = flags
	binary.BigEndian.PutUint16(seg[14:], 65535)
	copy(seg[20:], b.opts)
	copy(seg[20+len(b.opts):], b.payload)
	s := uint32(0)
	sa, da := src.Addr().As4(), dst.Addr().As4()
	for _, p := range [][]byte{sa[:], da[:], {0, 6, byte(len(seg) >> 8), byte(len(seg))}, seg} {
		for j := 0; j < len(p); j += 2 {
			v := uint32(p[j]) << 8
			if j+1 < len(p) {
				v |= uint32(p[j+1])
			}
			s += v
		}
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	sum := ^uint16(s)
	if b.badSum {
		sum ^= 0x5a5a
	}
	binary.BigEndian.PutUint16(seg[16:], sum)
	return seg
}

// TestTCPMalformedSegments: crafted segments from the peer namespace (a
// raw socket) with malformed options (length 0, 1, past the header,
// truncated or mis-sized MSS, window scale, SACK-permitted, timestamps,
// SACK), a data offset below 5 or past the segment, or a bad checksum,
// as SYNs to an offloaded listener and as segments of an established
// offloaded connection with its current sequence numbers. The stack
// handles the options as Linux does (parsing stops; the segment counts),
// drops the malformed headers and bad checksums (tcp_invalid_segments,
// tcp_checksum_errors) without taking their payload into the stream;
// afterwards the connection moves 1 MB each way byte-exact and a new
// connection is accepted. The ring received every crafted segment; A's
// kernel TCP saw none.
func TestTCPMalformedSegments(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t, ring.Config{})
	p := l.p
	rl, err := l.r.ListenTCP(netip.AddrPortFrom(p.A.Addr4(), 0), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	laddr := rl.LocalAddr()
	kernel := func() [5]uint64 {
		var v [5]uint64
		for i, f := range []string{"InSegs", "InErrs", "OutRsts", "PassiveOpens", "ActiveOpens"} {
			v[i] = p.A.NS.TCPStat(t, f)
		}
		return v
	}
	kernel0, st0, rx0 := kernel(), l.r.TCPStats(), l.r.Stats().TCPRXPackets.Load()

	// An established connection: the kernel client says hello, the ring's
	// side answers one byte, caught on B's link for its numbers.
	var kc *net.TCPConn
	dialed := make(chan error, 1)
	go func() {
		var err error
		kc, err = p.B.NS.DialTCP(laddr, 10*time.Second)
		if err == nil {
			_ = kc.SetDeadline(time.Now().Add(60 * time.Second))
			_, err = kc.Write([]byte("hello"))
		}
		dialed <- err
	}()
	sc, err := acceptWithin(rl, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := <-dialed; err != nil {
		t.Fatalf("kernel client: %v", err)
	}
	_ = sc.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadFull(sc, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	stop := capture(t, p.B)
	if _, err := sc.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(kc, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	kaddr := kc.LocalAddr().(*net.TCPAddr).AddrPort()
	var seqA, ackA uint32
	found := false
	for _, f := range stop() {
		_, src, dst, seg, ok := parseTCPFrame(f)
		if !ok || src != laddr.Addr() || dst != kaddr.Addr() || len(seg) < 20 ||
			binary.BigEndian.Uint16(seg[0:]) != laddr.Port() || binary.BigEndian.Uint16(seg[2:]) != kaddr.Port() {
			continue
		}
		if n := len(seg) - int(seg[12]>>4)*4; n == 1 {
			seqA, ackA, found = binary.BigEndian.Uint32(seg[4:])+1, binary.BigEndian.Uint32(seg[8:]), true
		}
	}
	if !found {
		t.Fatal("the ring's one-byte segment was not seen on B's link")
	}

	var fd int
	if err := p.B.NS.Do(func() error {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		return err
	}); err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrInet4{Addr: laddr.Addr().As4()}
	send := func(seg []byte) {
		if err := unix.Sendto(fd, seg, 0, to); err != nil {
			t.Fatalf("send a crafted segment: %v", err)
		}
	}
	sent, drops, sums := 0, 0, 0
	for i, b := range badSegments() {
		// As a SYN to the listener, from a port of its own.
		syn := b
		src := netip.AddrPortFrom(p.B.Addr4(), uint16(40000+i))
		send(syn.build(src, laddr, uint32(i)*104729, 0, 0x02))
		// As the connection's next segment (pure ACKs for the options:
		// their payload would be taken, as Linux takes it).
		if !b.drop {
			b.payload = nil
		}
		send(b.build(kaddr, laddr, ackA, seqA, 0x10|0x08))
		sent += 2
		if b.drop && !b.badSum {
			drops += 2
		}
		if b.badSum {
			sums += 2
		}
	}
	// The stack works through them on its own goroutines.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := l.r.TCPStats()
		if st.InvalidSegments-st0.InvalidSegments >= uint64(drops) && st.ChecksumErrors-st0.ChecksumErrors >= uint64(sums) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d crafted segments: %d invalid (want %d), %d checksum errors (want %d); stack %+v", sent,
				st.InvalidSegments-st0.InvalidSegments, drops, st.ChecksumErrors-st0.ChecksumErrors, sums, st)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The connection carries on byte-exact: no crafted byte got in.
	reply := payload(21, 1_000_000)
	peerErr := make(chan error, 1)
	go func() { peerErr <- netlab.HashPeer(kc, reply, 60*time.Second) }()
	out := payload(22, 1_000_000)
	checkAnswer(t, out, exchange(t, sc, out), reply)
	if err := <-peerErr; err != nil {
		t.Fatalf("kernel peer: %v", err)
	}
	// And the listener still accepts.
	go func() {
		c, err := p.B.NS.DialTCP(laddr, 10*time.Second)
		if err == nil {
			err = netlab.HashPeer(c, []byte("next"), 30*time.Second)
		}
		peerErr <- err
	}()
	nc, err := acceptWithin(rl, 15*time.Second)
	if err != nil {
		t.Fatalf("accept after the crafted segments: %v", err)
	}
	checkAnswer(t, []byte("after"), exchange(t, nc, []byte("after")), []byte("next"))
	_ = nc.Close()
	if err := <-peerErr; err != nil {
		t.Fatalf("second kernel client: %v", err)
	}
	if rx := l.r.Stats().TCPRXPackets.Load() - rx0; rx < uint64(sent) {
		t.Errorf("the ring received %d TCP frames, fewer than the %d crafted", rx, sent)
	}
	if k := kernel(); k != kernel0 {
		t.Errorf("A's kernel TCP counters (InSegs, InErrs, OutRsts, PassiveOpens, ActiveOpens) moved: %v -> %v", kernel0, k)
	}
	st := l.r.TCPStats()
	t.Logf("%d crafted segments: %d invalid, %d checksum errors, %d resets sent, %d segments received",
		sent, st.InvalidSegments-st0.InvalidSegments, st.ChecksumErrors-st0.ChecksumErrors,
		st.ResetsSent-st0.ResetsSent, st.SegmentsReceived-st0.SegmentsReceived)
}
