package stream

import (
	"encoding/hex"
	"net/netip"
	"testing"
)

// TestLayout pins the event layout documented in docs/shm-queue.md.
func TestLayout(t *testing.T) {
	cases := []struct {
		e   Event
		hex string
	}{
		{Event{Kind: Error, Errno: 111}, "0300" + "0000" + "6f000000" + "00000000000000000000000000000000"},
		{Event{Kind: Acceptable, Addr: netip.MustParseAddrPort("192.0.2.2:40000")}, "0400" + "409c" + "00000000" + "00000000000000000000ffffc0000202"},
		{Event{Kind: Connected, Addr: netip.MustParseAddrPort("[2001:db8::1]:80")}, "0100" + "5000" + "00000000" + "20010db8000000000000000000000001"},
		{Event{Kind: EOF}, "0200" + "0000" + "00000000" + "00000000000000000000000000000000"},
	}
	for _, c := range cases {
		b := make([]byte, EventLen)
		Put(b, c.e)
		if got := hex.EncodeToString(b); got != c.hex {
			t.Errorf("%+v:\n got %s\nwant %s", c.e, got, c.hex)
		}
		back, err := Parse(b)
		if err != nil || back != c.e {
			t.Errorf("round trip of %+v: %+v, %v", c.e, back, err)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	if _, err := Parse(make([]byte, EventLen-1)); err == nil {
		t.Error("short event accepted")
	}
	b := make([]byte, EventLen)
	for _, kind := range []byte{0, 5, 0xff} {
		b[0] = kind
		if _, err := Parse(b); err == nil {
			t.Errorf("kind %d accepted", kind)
		}
	}
}
