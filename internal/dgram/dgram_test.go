package dgram

import (
	"bytes"
	"net/netip"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, addr := range []netip.AddrPort{
		netip.MustParseAddrPort("10.1.2.3:4567"),
		netip.MustParseAddrPort("[fd00:bd::1]:11111"),
		{},
	} {
		rec := make([]byte, HeaderLen+5)
		h := Header{Addr: addr, Flags: FlagSWTimestamp | FlagHWRaw, TSSW: 1, TSHWRaw: -2, TSHWSys: 3}
		Put(rec, &h)
		copy(rec[HeaderLen:], "hello")
		var got Header
		p, err := Parse(rec, &got)
		if err != nil {
			t.Fatal(err)
		}
		if got != h || !bytes.Equal(p, []byte("hello")) {
			t.Fatalf("round trip of %+v: got %+v, payload %q", h, got, p)
		}
	}
}

// TestLayout pins the byte layout a C shim relies on.
func TestLayout(t *testing.T) {
	rec := make([]byte, HeaderLen)
	Put(rec, &Header{Addr: netip.MustParseAddrPort("1.2.3.4:258"), Flags: 0x0304, TSSW: 0x0102030405060708})
	want := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4, 2, 1, 4, 3, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1}
	if !bytes.Equal(rec[:32], want) {
		t.Fatalf("layout:\n got %x\nwant %x", rec[:32], want)
	}
}

func TestShort(t *testing.T) {
	var h Header
	if _, err := Parse(make([]byte, HeaderLen-1), &h); err != ErrShort {
		t.Fatalf("short record: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(make([]byte, HeaderLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		p, err := Parse(b, &h)
		if err == nil && len(p) != len(b)-HeaderLen {
			t.Fatalf("payload length %d of %d-byte record", len(p), len(b))
		}
	})
}
