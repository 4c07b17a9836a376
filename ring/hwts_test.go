package ring_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// Every datagram received through AF_XDP, and through the TAP path,
// carries a software timestamp between the sender's send time and the
// application's receive time; on veth (no PHC, no hardware stamps) the
// hardware slots are absent, not zero.
func TestRXTimestampsOnVeth(t *testing.T) {
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			core, logs := observer.New(zap.InfoLevel)
			cfg := path.cfg
			cfg.HWTimestamps, cfg.Log = tsconv.ModeSync, zap.New(core)
			l := newLab(t, cfg)
			if m := l.r.HWTimestampMode(); m != tsconv.ModeDisable {
				t.Fatalf("effective mode %v on veth, want disable", m)
			}
			if _, ok := l.r.HWTimestampErrorNs(); ok {
				t.Fatal("an error estimate without a converter")
			}
			open := logs.FilterMessage("ring open").All()
			if len(open) != 1 || !strings.Contains(fmt.Sprint(open[0].ContextMap()["hw_ts_reason"]), "no PHC on "+l.p.A.Name) {
				t.Fatalf("ring open log line does not say why the mode is lower: %+v", open)
			}
			const n = 50
			checkSoftwareStamps(t, l, n)
			if path.name != "afxdp" {
				return
			}
			// veth stamps nothing in hardware, so the ring keeps the plain
			// program: a device-bound one would gain nothing and risks the
			// 6.18 unregister oops (deviceStamps).
			if l.r.Program().RXTimestamps() {
				t.Fatal("device-bound timestamping program attached on veth, which has no hardware stamps")
			}
			if frames, _ := ring.RXMetadataStats(l.r); frames != 0 {
				t.Fatalf("provider read metadata on %d frames without the timestamping program", frames)
			}
		})
	}
}

// checkSoftwareStamps sends n datagrams from the peer and checks each
// one's timestamps.
func checkSoftwareStamps(t *testing.T, l *lab, n int) {
	t.Helper()
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	sent := make([]int64, n)
	for i := range n {
		sent[i] = time.Now().UnixNano()
		if _, err := peer.WriteToUDPAddrPort([]byte(fmt.Sprintf("ts %d", i)), ep.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make([]ring.Message, n)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 64)
	}
	for got := 0; got < n; {
		k, err := ep.RecvBatch(msgs[got:], time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatalf("after %d datagrams: %v", got, err)
		}
		recvd := time.Now().UnixNano()
		for _, m := range msgs[got : got+k] {
			var i int
			if _, err := fmt.Sscanf(string(m.Buf[:m.N]), "ts %d", &i); err != nil || i < 0 || i >= n {
				t.Fatalf("payload %q", m.Buf[:m.N])
			}
			h := m.Header
			if h.Flags != dgram.FlagSWTimestamp || h.TSHWRaw != 0 || h.TSHWSys != 0 {
				t.Fatalf("datagram %d: flags %#x raw %d sys %d: want only the software slot", i, h.Flags, h.TSHWRaw, h.TSHWSys)
			}
			if h.TSSW < sent[i] || h.TSSW > recvd {
				t.Fatalf("datagram %d: software stamp %d outside [send %d, receive %d]", i, h.TSSW, sent[i], recvd)
			}
		}
		got += k
	}
}

// A ring without hardware timestamps (the in-process default) attaches the
// plain program and reads no metadata.
func TestRXTimestampsOff(t *testing.T) {
	l := newLab(t, ring.Config{})
	if l.r.Program().RXTimestamps() || l.r.HWTimestampMode() != tsconv.ModeDisable || l.r.Caps().HWTimestamps {
		t.Fatalf("timestamping on without being asked: program %v mode %v caps %+v",
			l.r.Program().RXTimestamps(), l.r.HWTimestampMode(), l.r.Caps())
	}
}
