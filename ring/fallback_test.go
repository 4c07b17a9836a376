package ring_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/ring"
)

// TestParseFallback: the three names, and a helpful error otherwise.
func TestParseFallback(t *testing.T) {
	for _, f := range []ring.Fallback{ring.FallbackNone, ring.FallbackAuto, ring.FallbackTAP} {
		got, err := ring.ParseFallback(strings.ToUpper(f.String()))
		if err != nil || got != f {
			t.Errorf("ParseFallback(%q) = %v, %v", f.String(), got, err)
		}
	}
	if _, err := ring.ParseFallback("vf"); err == nil || !strings.Contains(err.Error(), "none, auto or tap") {
		t.Errorf("ParseFallback(vf): %v", err)
	}
}

// TestPlugOutUnderLoad: a 50,000 datagrams/s stream reaches a ring with the
// auto fallback; the XDP program's link is detached from outside mid-stream
// (an operator's `ip link set dev X xdp off` cannot remove a bpf_link:
// `bpftool link detach` is how the program is taken away). The ring moves
// to the TAP path, restores the fast path by itself a second later and
// moves back. Lost datagrams and the longest receive gap (the switch time)
// are reported; the test fails above 1% loss or a 100 ms gap.
func TestPlugOutUnderLoad(t *testing.T) {
	if _, err := exec.LookPath("bpftool"); err != nil {
		if os.Getenv("BYPASSD_REQUIRE_PRIV") == "1" {
			t.Fatal("bpftool is needed to detach the XDP link (apt-get install bpftool)")
		}
		t.Skip("bpftool is needed to detach the XDP link")
	}
	// Receive rings of 8192 frames (160 ms of the stream) so that the
	// engine thread being starved on a loaded 2-core machine does not
	// count as switch loss.
	l := newLab(t, ring.Config{Fallback: ring.FallbackAuto, Frames: 16384})
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	sender := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))

	const rate = 50000 // datagrams per second, sent 50 per millisecond
	var sent atomic.Uint64
	stop := make(chan struct{})
	sendErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		start := time.Now()
		for {
			select {
			case <-stop:
				sendErr <- nil
				return
			default:
			}
			due := uint64(time.Since(start).Seconds() * rate)
			for sent.Load() < due {
				binary.LittleEndian.PutUint64(buf, sent.Load())
				if _, err := sender.WriteToUDPAddrPort(buf, ep.LocalAddr()); err != nil {
					sendErr <- err
					return
				}
				sent.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()

	type arrival struct {
		seq uint64
		ts  int64
	}
	var got []arrival
	recvDone := make(chan error, 1)
	go func() {
		msgs := make([]ring.Message, 64)
		for i := range msgs {
			msgs[i].Buf = make([]byte, 64)
		}
		for {
			n, err := ep.RecvBatch(msgs, time.Now().Add(500*time.Millisecond))
			if err != nil {
				recvDone <- err
				return
			}
			for _, m := range msgs[:n] {
				if m.Header.Flags&dgram.FlagSWTimestamp == 0 || m.Header.TSSW == 0 {
					recvDone <- fmt.Errorf("datagram %d without a software receive timestamp", binary.LittleEndian.Uint64(m.Buf))
					return
				}
				got = append(got, arrival{seq: binary.LittleEndian.Uint64(m.Buf), ts: m.Header.TSSW})
			}
		}
	}()

	waitFor := func(what string, cond func(ring.FallbackStats) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(l.r.FallbackStats()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s (%+v)", what, l.r.FallbackStats())
			}
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The program is attached through a bpf_link, which netlink cannot
	// replace: an operator's `xdp off` fails and the fast path stays.
	if out, err := l.p.A.NS.Command(ctx, "ip", "link", "set", "dev", l.p.A.Name, "xdp", "off").CombinedOutput(); err == nil {
		t.Errorf("ip link set dev %s xdp off succeeded on a bpf_link: %s", l.p.A.Name, out)
	}
	if st := l.r.FallbackStats(); st.OnTAP || st.Plugouts != 0 {
		t.Fatalf("after a refused xdp off: %+v, want the fast path", st)
	}
	id, err := l.r.Program().LinkID()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "bpftool", "link", "detach", "id", fmt.Sprint(id)).CombinedOutput(); err != nil {
		t.Fatalf("bpftool link detach id %d: %v: %s", id, err, out)
	}
	detachedAt := time.Now() // the detach happened before bpftool returned
	waitFor("switch to the TAP path", func(s ring.FallbackStats) bool { return s.OnTAP })
	detected := time.Since(detachedAt)

	waitFor("switch back to the fast path", func(s ring.FallbackStats) bool { return s.Plugins == 1 })

	if attached, err := l.r.Program().Attached(); err != nil || !attached {
		t.Fatalf("fast path restored but its program is not attached: %v, %v", attached, err)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	if err := <-sendErr; err != nil {
		t.Fatalf("sender: %v", err)
	}
	total := sent.Load()
	// Let the last datagrams arrive; the receiver stops at its deadline.
	if err := <-recvDone; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("receiver: %v", err)
	}
	// The switch time is the longest stretch of the stream that was lost
	// (consecutive missing sequence numbers, at the sending rate); the
	// longest gap between deliveries also counts stalls of the sender on
	// a loaded machine, so it is only reported.
	seen := make([]bool, total)
	var maxGap time.Duration
	for i, a := range got {
		if a.seq < total {
			seen[a.seq] = true
		}
		if i > 0 {
			maxGap = max(maxGap, time.Duration(a.ts-got[i-1].ts))
		}
	}
	var lost, run, maxRun uint64
	for _, ok := range seen {
		if ok {
			run = 0
			continue
		}
		lost++
		run++

		maxRun = max(maxRun, run)
	}
	switchTime := time.Duration(maxRun) * time.Second / rate
	st := l.r.FallbackStats()
	t.Logf("sent %d, lost %d (%.3f%%); switch time (longest lost stretch) %v; switched to the TAP %v after the detach returned; longest receive gap %v; TAP carried %d datagrams; plug-outs %d, plug-ins %d",
		total, lost, 100*float64(lost)/float64(total), switchTime, detected, maxGap, st.RXPackets, st.Plugouts, st.Plugins)
	if st.Plugouts != 1 || st.Plugins != 1 || st.RXPackets == 0 {
		t.Errorf("fallback counters %+v: want one plug-out, one plug-in and datagrams through the TAP", st)
	}
	if float64(lost) > 0.01*float64(total) {
		t.Errorf("lost %d of %d datagrams: more than 1%%", lost, total)
	}
	if switchTime > 100*time.Millisecond || detected > 100*time.Millisecond {
		t.Errorf("switch time %v, detection %v: more than 100 ms", switchTime, detected)
	}
}
