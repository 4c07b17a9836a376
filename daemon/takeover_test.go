package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/takeover"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/sockq"
)

// takeOver runs Takeover in the lab's namespace and serves the new daemon
// until the test ends; its cleanup checks the new daemon stops cleanly.
func takeOver(t *testing.T, l *lab, opts TakeoverOptions) (*Daemon, error) {
	t.Helper()
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("new")
	var d *Daemon
	err := l.p.A.NS.Do(func() error {
		var err error
		d, err = Takeover(l.cfg, opts, log)
		return err
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("new daemon Serve: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("new daemon Close: %v", err)
		}
		if _, err := os.Stat(l.cfg.SocketPath); !os.IsNotExist(err) {
			t.Errorf("socket file left behind by the new daemon: %v", err)
		}
	})
	return d, nil
}

// stream counts numbered datagrams a kernel peer sends to sockets.
type stream struct {
	sent     atomic.Uint64
	mu       sync.Mutex
	got      []map[uint64]bool
	last     []time.Time
	longest  time.Duration
	received atomic.Uint64
	when     []time.Time
}

// TestTakeoverUnderTraffic: a second daemon takes over while a kernel peer
// streams numbered datagrams to four sockets of one client: no datagram is
// lost, the client's connection, sockets, options and pacing rate survive,
// its sends still leave, the old daemon's Serve returns, the new one's ring
// counters go on from the old one's, and new clients are accepted.
func TestTakeoverUnderTraffic(t *testing.T) {
	t.Parallel()
	// Only the current version: state documents before version 3 carry
	// per-socket memfds, which control protocol version 2 (one session
	// memory per client) no longer has, so there is no roll-back to them.
	testTakeoverUnderTraffic(t, TakeoverOptions{MinState: takeover.MinVersion, MaxState: takeover.Version}, false)
}

// TestTakeoverFromRingDoorbells: the same from a daemon whose clients ring
// the rings' shared doorbells (before lane doorbells): the new daemon
// serves their lanes through the ring's doorbell.
func TestTakeoverFromRingDoorbells(t *testing.T) {
	t.Parallel()
	testTakeoverUnderTraffic(t, TakeoverOptions{MinState: takeover.MinVersion, MaxState: takeover.Version}, true)
}

func testTakeoverUnderTraffic(t *testing.T, opts TakeoverOptions, ringDoorbells bool) {
	// 4,096 frames: the sockets' RX rings hold 2,048, what an engine
	// starved on a loaded machine (race detector on) needs in hand.
	l := newLab(t, config.Config{QueueBytes: 1 << 20, Frames: 4096})
	l.d.ringDoorbells.Store(ringDoorbells)
	c := helloClient(t, l)
	const nsock = 4
	var socks []*clientSocket
	var locals []netip.AddrPort
	for range nsock {
		s := openSocket(t, c, unix.AF_INET)
		local, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
		if err != nil {
			t.Fatal(err)
		}
		socks, locals = append(socks, s), append(locals, local)
	}
	if _, err := c.ok(ctlproto.CodeSetSockOpt, socks[1].id, ctlproto.SetSockOpt{Level: unix.IPPROTO_IP, Name: unix.IP_TTL, Value: le32(7)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ok(ctlproto.CodeSetSockOpt, socks[2].id, ctlproto.SetSockOpt{Level: unix.SOL_SOCKET, Name: unix.SO_MAX_PACING_RATE, Value: le32(1_250_000)}); err != nil {
		t.Fatal(err)
	}
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()

	st := &stream{got: make([]map[uint64]bool, nsock), last: make([]time.Time, nsock)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range socks {
		st.got[i] = map[uint64]bool{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]sockq.Message, 32)
			for j := range msgs {
				msgs[j].Buf = make([]byte, 64)
			}
			for {
				n, err := s.conn.RecvBatch(msgs, time.Now().Add(50*time.Millisecond))
				now := time.Now()
				st.mu.Lock()
				if n > 0 {
					if !st.last[i].IsZero() && now.Sub(st.last[i]) > st.longest {
						st.longest = now.Sub(st.last[i])
					}
					st.last[i] = now
				}
				for _, m := range msgs[:n] {
					st.got[i][binary.LittleEndian.Uint64(m.Buf[:8])] = true
				}
				st.mu.Unlock()
				st.received.Add(uint64(n))
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("socket %d: receive: %v", i, err)
					return
				}
				select {
				case <-stop:
					if n == 0 {
						return
					}
				default:
				}
			}
		}()
	}
	// ~8,000 datagrams/s over the four sockets until told to stop.
	sendDone := make(chan struct{})
	sendStop := make(chan struct{})
	go func() {
		defer close(sendDone)
		b := make([]byte, 16)
		for seq := uint64(0); ; seq++ {
			select {
			case <-sendStop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(b, seq/nsock)
			if _, err := peer.WriteToUDPAddrPort(b, locals[seq%nsock]); err != nil {
				t.Errorf("peer send: %v", err)
				return
			}
			st.sent.Add(1)
			if seq%nsock == 0 {
				st.mu.Lock()
				st.when = append(st.when, time.Now())
				st.mu.Unlock()
			}
			if seq%40 == 39 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Errorf("timed out waiting for %s", what)
				return
			}
		}
	}
	waitFor("traffic before the takeover", func() bool { return st.received.Load() >= 1000 })
	oldRX := l.d.Rings()[0].Stats().RXPackets.Load()
	// Loss is checked from here on.
	first := st.sent.Load() / nsock

	start := time.Now()
	d2, err := takeOver(t, l, opts)
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	t.Logf("takeover took %v; sent %d", time.Since(start), st.sent.Load())
	d2.mu.Lock()
	checked := 0
	for s := range d2.sessions {
		if s.mem != nil {
			checked++
			if (s.mem.bells == nil) != ringDoorbells {
				t.Errorf("adopted session of pid %d: lane doorbells %v, want %v", s.cred.Pid, s.mem.bells != nil, !ringDoorbells)
			}
		}
	}
	d2.mu.Unlock()
	if checked == 0 {
		t.Error("no adopted session with memory to check the lane doorbells of")
	}
	select {
	case err := <-l.served:
		l.served <- err
		if err != nil {
			t.Fatalf("old daemon's Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old daemon's Serve did not return after handing over")
	}
	atTakeover := st.received.Load()
	waitFor("traffic after the takeover", func() bool { return st.received.Load() >= atTakeover+1000 })
	close(sendStop)
	<-sendDone
	waitFor("every datagram", func() bool { return st.received.Load() >= st.sent.Load() })
	close(stop)
	wg.Wait()
	sent := st.sent.Load()
	for i := range socks {
		want := sent / nsock
		if uint64(i) < sent%nsock {
			want++
		}
		got := uint64(0)
		for q := range st.got[i] {
			if q >= first {
				got++
			}
		}
		if got != want-first {
			var missing []uint64
			for q := first; q < want && len(missing) < 50; q++ {
				if !st.got[i][q] {
					missing = append(missing, q)
				}
			}
			t.Errorf("socket %d: %d distinct datagrams of %d since the takeover began; missing %v (sent %s .. %s)", i, got, want-first, missing,
				st.when[missing[0]].Format("15:04:05.000"), st.when[missing[len(missing)-1]].Format("15:04:05.000"))
		}
	}
	r2 := d2.Rings()[0].Stats()
	t.Logf("sent %d, received %d; longest gap %v; new ring rx_packets %d (old had %d before), from the kernel backlog %d",
		sent, st.received.Load(), st.longest, r2.RXPackets.Load(), oldRX, r2.RXKernelBacklog.Load())
	if r2.RXPackets.Load() < sent {
		t.Errorf("new ring counts %d received, %d were sent: counters did not carry over", r2.RXPackets.Load(), sent)
	}

	// The same connection goes on: options, pacing, sends, a new socket.
	r, err := c.ok(ctlproto.CodeGetSockOpt, socks[1].id, ctlproto.GetSockOpt{Level: unix.IPPROTO_IP, Name: unix.IP_TTL})
	if err != nil || binary.LittleEndian.Uint32(r.m.(*ctlproto.SockOptValue).Value) != 7 {
		t.Errorf("IP_TTL after the takeover: %v %v", r.m, err)
	}
	r, err = c.ok(ctlproto.CodeGetSockOpt, socks[2].id, ctlproto.GetSockOpt{Level: unix.SOL_SOCKET, Name: unix.SO_MAX_PACING_RATE})
	if err != nil || binary.LittleEndian.Uint32(r.m.(*ctlproto.SockOptValue).Value) != 10_000 {
		t.Errorf("pacing rate after the takeover: %v %v", r.m, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i, s := range socks {
		if n, err := s.conn.SendBatch([][]byte{[]byte("after")}, peerAddr, deadline); n != 1 || err != nil {
			t.Fatalf("socket %d: send after the takeover: %d %v", i, n, err)
		}
	}
	_ = peer.SetReadDeadline(deadline)
	buf := make([]byte, 64)
	from := map[netip.AddrPort]bool{}
	for range socks {
		n, src, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != "after" {
			t.Fatalf("peer receive after the takeover: %q %v", buf[:n], err)
		}
		from[netip.AddrPortFrom(src.Addr().Unmap(), src.Port())] = true
	}
	for _, local := range locals {
		if !from[local] {
			t.Errorf("nothing from %v after the takeover", local)
		}
	}
	s := openSocket(t, c, unix.AF_INET)
	if _, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false); err != nil {
		t.Errorf("bind a new socket after the takeover: %v", err)
	}
	c2 := helloClient(t, l)
	if _, err := c2.open(unix.AF_INET, 0); err != nil {
		t.Errorf("a new client after the takeover: %v", err)
	}
	fl, err := d2.Rings()[0].Flows()
	if err != nil || len(fl) != nsock+1 {
		t.Errorf("new daemon's flows: %v %v, want %d", fl, err, nsock+1)
	}
}

// TestTakeoverRefused: a new daemon that reads no state version the old
// one writes is refused before anything moves; the old daemon serves on
// with its client's socket intact.
func TestTakeoverRefused(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{})
	c := helloClient(t, l)
	s := openSocket(t, c, unix.AF_INET)
	local, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = takeOver(t, l, TakeoverOptions{MinState: takeover.Version + 1, MaxState: takeover.Version + 1})
	if err == nil || !errors.Is(err, unix.EPROTONOSUPPORT) || !strings.Contains(err.Error(), "no state version in common") {
		t.Fatalf("takeover with an unknown state version: %v", err)
	}
	// The old daemon still serves: the socket receives, a new client
	// is accepted.
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	if _, err := peer.WriteToUDPAddrPort([]byte("still here"), local); err != nil {
		t.Fatal(err)
	}
	msgs := []sockq.Message{{Buf: make([]byte, 64)}}
	if n, err := s.conn.RecvBatch(msgs, time.Now().Add(10*time.Second)); n != 1 || err != nil || string(msgs[0].Buf[:msgs[0].N]) != "still here" {
		t.Fatalf("receive after a refused takeover: %d %v", n, err)
	}
	helloClient(t, l)
	// The refused taker's connection ends a moment later.
	for end := time.Now().Add(5 * time.Second); l.d.Sessions() != 2 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if l.d.Sessions() != 2 {
		t.Errorf("%d sessions, want 2", l.d.Sessions())
	}
}

// TestTakeoverAbandoned: a new daemon that built everything from the old
// one's state and then gave up (as if killed there) leaves the old daemon
// serving: no datagram of the stream lost, its client's sockets and flows
// intact, new clients accepted, and a takeover after it works.
func TestTakeoverAbandoned(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{QueueBytes: 1 << 20, Frames: 4096})
	c := helloClient(t, l)
	s := openSocket(t, c, unix.AF_INET)
	local, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
	if err != nil {
		t.Fatal(err)
	}
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	var sent, got atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := peer.WriteToUDPAddrPort([]byte("abandoned"), local); err == nil {
				sent.Add(1)
			}
			if i%10 == 9 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	go func() {
		defer wg.Done()
		msgs := make([]sockq.Message, 64)
		for i := range msgs {
			msgs[i].Buf = make([]byte, 64)
		}
		for {
			k, _ := s.conn.RecvBatch(msgs, time.Now().Add(20*time.Millisecond))
			got.Add(uint64(k))
			select {
			case <-stop:
				if k == 0 && got.Load() >= sent.Load() {
					return
				}
			default:
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := takeOver(t, l, TakeoverOptions{abortAfterBuild: true}); err == nil || !strings.Contains(err.Error(), "aborted after the build") {
		t.Fatalf("aborted takeover: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("after the abandoned takeover: %d of %d datagrams received", got.Load(), sent.Load())
	}
	if got.Load() != sent.Load() {
		t.Fatalf("%d of %d datagrams received", got.Load(), sent.Load())
	}
	if fl, err := l.d.Rings()[0].Flows(); err != nil || len(fl) != 1 {
		t.Errorf("old daemon's flows after the abandoned takeover: %v %v", fl, err)
	}
	helloClient(t, l)
	// The old daemon can still hand over, and the socket goes on.
	d2, err := takeOver(t, l, TakeoverOptions{})
	if err != nil {
		t.Fatalf("takeover after an abandoned one: %v", err)
	}
	if _, err := peer.WriteToUDPAddrPort([]byte("after"), local); err != nil {
		t.Fatal(err)
	}
	msgs := []sockq.Message{{Buf: make([]byte, 64)}}
	if n, err := s.conn.RecvBatch(msgs, time.Now().Add(10*time.Second)); n != 1 || err != nil || string(msgs[0].Buf[:msgs[0].N]) != "after" {
		t.Fatalf("receive after the second takeover: %d %v", n, err)
	}
	if d2.Rings()[0].Stats().RXPackets.Load() < sent.Load()+1 {
		t.Errorf("new ring counted %d received, %d were sent", d2.Rings()[0].Stats().RXPackets.Load(), sent.Load()+1)
	}
}

// TestTakeoverBlackout: a takeover with 1,000 other bound sockets while a
// kernel peer streams numbered datagrams to one socket loses none of them,
// the new ring's counters show the fast path carried every one (the
// kernel's UDP receive counter did not move), and the pause is logged: the
// longest gap the client saw and the data path's own handover window (old
// engine stopped to new engine started). With BYPASSD_BENCH_TAKEOVER=1 it
// also runs at 0 and 100 sockets (the table in docs/benchmarks.md).
func TestTakeoverBlackout(t *testing.T) {
	counts := []int{1000}
	if os.Getenv("BYPASSD_BENCH_TAKEOVER") != "" {
		counts = []int{0, 100, 1000}
	}
	for _, n := range counts {
		t.Run(strconv.Itoa(n), func(t *testing.T) { testTakeoverBlackout(t, n) })
	}
}

func testTakeoverBlackout(t *testing.T, n int) {
	// 4,096 frames: the socket's RX ring holds 2,048, a quarter of a
	// second of the stream, which the old engine needs while the new
	// daemon, in this same process, builds 1,000 sockets on a loaded
	// machine (two processes do not compete like that).
	l := newLab(t, config.Config{QueueBytes: 64 << 10, Frames: 4096})
	c := helloClient(t, l)
	for range n {
		s := openSocket(t, c, unix.AF_INET)
		if _, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false); err != nil {
			t.Fatal(err)
		}
	}
	s := openSocket(t, c, unix.AF_INET)
	local, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
	if err != nil {
		t.Fatal(err)
	}
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	kernelBefore, err := l.p.A.NS.SNMPCounter("Udp", "InDatagrams")
	if err != nil {
		t.Fatal(err)
	}
	var sent atomic.Uint64
	got := map[uint64]bool{}
	var longest time.Duration
	var gapFrom time.Time
	var batches []time.Time
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		msgs := make([]sockq.Message, 64)
		for i := range msgs {
			msgs[i].Buf = make([]byte, 64)
		}
		var last time.Time
		for {
			k, _ := s.conn.RecvBatch(msgs, time.Now().Add(20*time.Millisecond))
			if k > 0 {
				now := time.Now()
				if !last.IsZero() && now.Sub(last) > longest {
					longest, gapFrom = now.Sub(last), last
				}
				last = now
				batches = append(batches, now)
				for _, m := range msgs[:k] {
					got[binary.LittleEndian.Uint64(m.Buf[:8])] = true
				}
				continue
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		b := make([]byte, 8)
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(b, i)
			if _, err := peer.WriteToUDPAddrPort(b, local); err != nil {
				t.Errorf("peer send: %v", err)
				return
			}
			sent.Add(1)
			if i%10 == 9 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	d2, err := takeOver(t, l, TakeoverOptions{})
	if err != nil {
		close(stop)
		t.Fatal(err)
	}
	took := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-sendDone
	st := d2.Rings()[0].Stats()
	for end := time.Now().Add(10 * time.Second); st.RXPackets.Load() < sent.Load() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	<-done
	// Stragglers the receiver's last deadline missed.
	msgs := []sockq.Message{{Buf: make([]byte, 64)}}
	for {
		k, _ := s.conn.RecvBatch(msgs, time.Now().Add(200*time.Millisecond))
		if k == 0 {
			break
		}
		got[binary.LittleEndian.Uint64(msgs[0].Buf[:8])] = true
	}
	total := sent.Load()
	var missing []uint64
	for i := uint64(0); i < total; i++ {
		if !got[i] && len(missing) < 20 {
			missing = append(missing, i)
		}
	}
	// The data path's own blackout: old engines stopped to new engines
	// started, and the gap the client saw around it.
	startedAt := d2.Rings()[0].StartedAt()
	window := startedAt.Sub(l.d.quiesceAt)
	var before, after time.Time
	for _, b := range batches {
		if b.Before(l.d.quiesceAt) {
			before = b
		} else if after.IsZero() && b.After(startedAt) {
			after = b
		}
	}
	t.Logf("%d other sockets: takeover %v; handover window %v, client gap across it %v; longest gap %v (from %s); sent %d, received %d; new ring rx_packets %d, rx_queue_full %d",
		n, took.Round(time.Millisecond), window.Round(10*time.Microsecond), after.Sub(before).Round(10*time.Microsecond),
		longest.Round(100*time.Microsecond), gapFrom.Format("15:04:05.000"), total, len(got), st.RXPackets.Load(), st.RXQueueFull.Load())
	if uint64(len(got)) != total || len(missing) > 0 {
		t.Errorf("%d of %d datagrams received; first missing %v", len(got), total, missing)
	}
	if st.RXPackets.Load() < total {
		t.Errorf("the rings counted %d received, %d were sent: not all came through the fast path", st.RXPackets.Load(), total)
	}
	kernelAfter, err := l.p.A.NS.SNMPCounter("Udp", "InDatagrams")
	if err != nil {
		t.Fatal(err)
	}
	if kernelAfter != kernelBefore {
		t.Errorf("the kernel received %d UDP datagrams during the takeover: they left the fast path", kernelAfter-kernelBefore)
	}
}
