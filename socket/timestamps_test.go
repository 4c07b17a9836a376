package socket

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/dgram"
)

// Through the daemon and the shim: every datagram carries a software
// timestamp between the sender's send time and the application's receive
// time once SO_TIMESTAMPING asks for it, none before; on veth the hardware
// slots are absent (OK false), not zero values reported as present. The TAP
// path too: its descriptor cannot give SO_TIMESTAMPING, the engine's
// software receive time is what it offers.
func TestE2ETimestamps(t *testing.T) { forEachPath(t, testE2ETimestamps) }

func testE2ETimestamps(t *testing.T, path string) {
	l := newLab(t, path)
	c := l.client(t)
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	dst := u.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	buf := make([]byte, 256)
	if err := u.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}

	// Not asked for: nothing reported.
	if _, err := peer.WriteToUDPAddrPort([]byte("quiet"), dst); err != nil {
		t.Fatal(err)
	}
	if _, _, ts, err := u.ReadMsgUDPTimestamps(buf); err != nil || ts != (Timestamps{}) {
		t.Fatalf("without SO_TIMESTAMPING: %+v %v", ts, err)
	}

	if err := u.SetTimestamping(TimestampAll); err != nil {
		t.Fatal(err)
	}
	if v, err := u.Option("SO_TIMESTAMPING"); err != nil || v != TimestampAll {
		t.Fatalf("SO_TIMESTAMPING reads back %#x, %v", v, err)
	}
	const n = 40
	sent := make([]time.Time, n)
	for i := range n {
		sent[i] = time.Now()
		if _, err := peer.WriteToUDPAddrPort([]byte(fmt.Sprintf("ts %d", i)), dst); err != nil {
			t.Fatal(err)
		}
	}
	for range n / 2 {
		k, _, ts, err := u.ReadMsgUDPTimestamps(buf)
		recvd := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		checkStamps(t, buf[:k], ts, sent, recvd)
	}
	// ReadBatch reports them too.
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 64)
	}
	for got := n / 2; got < n; {
		k, err := u.ReadBatch(msgs)
		recvd := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs[:k] {
			checkStamps(t, m.Buf[:m.N], m.TS, sent, recvd)
		}
		got += k
	}

	// Transmit timestamps are refused with the daemon's errno.
	if err := u.SetTimestamping(unix.SOF_TIMESTAMPING_TX_SOFTWARE); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Fatalf("TX timestamps: %v, want EOPNOTSUPP", err)
	}
}

func checkStamps(t *testing.T, payload []byte, ts Timestamps, sent []time.Time, recvd time.Time) {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(string(payload), "ts %d", &i); err != nil || i < 0 || i >= len(sent) {
		t.Fatalf("payload %q", payload)
	}
	if !ts.SoftwareOK || ts.Software.Before(sent[i]) || ts.Software.After(recvd) {
		t.Fatalf("datagram %d: software stamp %v (ok %v) outside [%v, %v]", i, ts.Software, ts.SoftwareOK, sent[i], recvd)
	}
	if ts.HardwareRawOK || ts.HardwareSysOK || !ts.HardwareRaw.IsZero() || !ts.HardwareSys.IsZero() {
		t.Fatalf("datagram %d: hardware slots present on veth: %+v", i, ts)
	}
}

// The socket's flags pick the slots; a slot the record lacks is never
// reported, whatever the flags.
func TestTimestampSlots(t *testing.T) {
	full := dgram.Header{Flags: dgram.FlagSWTimestamp | dgram.FlagHWRaw | dgram.FlagHWSys, TSSW: 10, TSHWRaw: 20, TSHWSys: 30}
	swOnly := dgram.Header{Flags: dgram.FlagSWTimestamp, TSSW: 10}
	for _, tc := range []struct {
		flags      uint32
		h          dgram.Header
		sw, raw, s bool
	}{
		{0, full, false, false, false},
		{TimestampSoftware, full, true, false, false},
		{TimestampRawHardware | TimestampRXHardware, full, false, true, false},
		{TimestampSysHardware, full, false, false, true},
		{TimestampAll, full, true, true, true},
		{TimestampAll, swOnly, true, false, false},
		// Zero is a valid hardware time: the flag decides, not the value.
		{TimestampAll, dgram.Header{Flags: dgram.FlagHWRaw}, false, true, false},
	} {
		var u UDPConn
		u.tsFlags.Store(tc.flags)
		ts := Timestamps{SoftwareOK: true, HardwareRawOK: true} // stale values are overwritten
		u.timestamps(&ts, &tc.h)
		if ts.SoftwareOK != tc.sw || ts.HardwareRawOK != tc.raw || ts.HardwareSysOK != tc.s {
			t.Errorf("flags %#x header %+v: %+v", tc.flags, tc.h, ts)
		}
		if ts.SoftwareOK && ts.Software.UnixNano() != tc.h.TSSW || ts.HardwareRawOK && ts.HardwareRaw.UnixNano() != tc.h.TSHWRaw ||
			ts.HardwareSysOK && ts.HardwareSys.UnixNano() != tc.h.TSHWSys {
			t.Errorf("flags %#x: values %+v, header %+v", tc.flags, ts, tc.h)
		}
	}
}

// BenchmarkTimestamps is the shim's per-datagram cost of reporting every
// slot.
func BenchmarkTimestamps(b *testing.B) {
	var u UDPConn
	u.tsFlags.Store(TimestampAll)
	h := dgram.Header{Flags: dgram.FlagSWTimestamp | dgram.FlagHWRaw | dgram.FlagHWSys, TSSW: 1, TSHWRaw: 2, TSHWSys: 3}
	var ts Timestamps
	for range b.N {
		u.timestamps(&ts, &h)
	}
}
