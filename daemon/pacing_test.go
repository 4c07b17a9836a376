package daemon

import (
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/sched/pacing"
)

func pacingStruct(kbps, burst uint32, typical uint16, size int) []byte {
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, kbps)
	binary.LittleEndian.PutUint32(b[4:], burst)
	binary.LittleEndian.PutUint16(b[8:], typical)
	return b
}

type pacingReadback struct {
	kbps, burst      uint32
	typical          uint16
	minKbps, maxKbps uint32
}

func readPacing(t *testing.T, k *socket) pacingReadback {
	t.Helper()
	b, err := k.option(unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE)
	if err != nil || len(b) != pacingOptionLen {
		t.Fatalf("get SO_MAX_PACING_RATE: %d bytes, %v", len(b), err)
	}
	le := binary.LittleEndian
	return pacingReadback{le.Uint32(b), le.Uint32(b[4:]), le.Uint16(b[8:]), le.Uint32(b[12:]), le.Uint32(b[16:])}
}

func TestPacingOption(t *testing.T) {
	k := testSocket(unix.AF_INET)
	tb := k.home.rates
	set := func(v []byte) error { return k.setOption(unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, v) }

	if got := readPacing(t, k); got.kbps != 0 || got.minKbps != pacing.DefaultMinKbps || got.maxKbps != pacing.DefaultMaxKbps {
		t.Errorf("unpaced socket reads %+v", got)
	}
	// u32 bytes/s: 1,250,000 B/s = 10 Mbit/s.
	if err := set(le32(1_250_000)); err != nil {
		t.Fatal(err)
	}
	if got := readPacing(t, k); got.kbps != 10_000 || got.burst != (pacing.Rate{Kbps: 10_000}).DefaultBurst() {
		t.Errorf("after 1250000 B/s: %+v", got)
	}
	// The extended form, 10 bytes and C's padded 12.
	for _, size := range []int{10, 12} {
		if err := set(pacingStruct(20_000, 6000, 1442, size)); err != nil {
			t.Fatalf("%d-byte struct: %v", size, err)
		}
		if got := readPacing(t, k); got.kbps != 20_000 || got.burst != 6000 || got.typical != 1442 {
			t.Errorf("after the %d-byte struct: %+v", size, got)
		}
	}
	if n, q := tb.Used(); n != 1 || q != 1 {
		t.Errorf("a socket changing its rate holds %d entries, %d references; want 1 and 1", n, q)
	}
	// 0 and ~0 remove the limit and release the entry.
	for _, v := range [][]byte{le32(0), le32(-1), pacingStruct(0, 9, 9, 10)} {
		if err := set(pacingStruct(30_000, 0, 0, 10)); err != nil {
			t.Fatal(err)
		}
		if err := set(v); err != nil {
			t.Errorf("set %v: %v", v, err)
		}
		if n, q := tb.Used(); n != 0 || q != 0 || k.rate != nil {
			t.Errorf("after %v: %d entries, %d references", v, n, q)
		}
	}
	// Bad input.
	for _, c := range []struct {
		v     []byte
		errno unix.Errno
		text  string
	}{
		{le32(124), unix.ERANGE, "1000..100000000 kbit/s"},            // 0 kbit/s but not 0
		{le32(124_999), unix.ERANGE, "125000..12500000000 bytes/s"},   // 999 kbit/s
		{pacingStruct(100_000_001, 0, 0, 10), unix.ERANGE, "outside"}, // above 100 Gbit/s
		{[]byte{1, 2, 3, 4, 5, 6, 7, 8}, unix.EINVAL, "10-byte struct"},
		{append(pacingStruct(10_000, 0, 0, 10), 1, 0), unix.EINVAL, "padding"},
		{nil, unix.EINVAL, "0 bytes"},
	} {
		err := set(c.v)
		if errnoOf(err) != c.errno || !strings.Contains(err.Error(), c.text) {
			t.Errorf("set %v: %v; want %v mentioning %q", c.v, err, c.errno, c.text)
		}
	}
	if tb.Stats().RefusedRange.Load() != 3 {
		t.Errorf("range refusals counted %d, want 3", tb.Stats().RefusedRange.Load())
	}
	// Closing a paced socket releases its entry.
	if err := set(le32(1_250_000)); err != nil {
		t.Fatal(err)
	}
	k.close()
	if n, q := tb.Used(); n != 0 || q != 0 {
		t.Errorf("after close: %d entries, %d references", n, q)
	}
}

func TestPacingTableFullThroughOption(t *testing.T) {
	home := &ringInfo{rates: pacing.NewTable(pacing.TableConfig{Device: "test0", Capacity: 2})}
	open := func() *socket {
		k := testSocket(unix.AF_INET)
		k.home = home
		return k
	}
	a, b, c := open(), open(), open()
	for i, k := range []*socket{a, b} {
		if err := k.setOption(unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, le32(int32(125_000*(i+1)))); err != nil {
			t.Fatal(err)
		}
	}
	err := c.setOption(unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, le32(125_000*5))
	if errnoOf(err) != unix.ENOSPC || !strings.Contains(err.Error(), "rate table is full") {
		t.Errorf("third rate in a 2-entry table: %v, want ENOSPC", err)
	}
	// A rate someone has already is shared even when the table is full.
	if err := c.setOption(unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, le32(125_000)); err != nil {
		t.Errorf("sharing an existing rate in a full table: %v", err)
	}
	if s := home.rates.Snapshot(); len(s.Entries) != 2 || s.Entries[0].Users != 2 {
		t.Errorf("snapshot %+v", s)
	}
}
