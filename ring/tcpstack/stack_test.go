package tcpstack

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
)

func TestDestination(t *testing.T) {
	v4 := make([]byte, 20)
	v4[0] = 0x45
	copy(v4[16:], []byte{192, 0, 2, 7})
	v6 := make([]byte, 40)
	v6[0] = 0x60
	d6 := netip.MustParseAddr("2001:db8::7").As16()
	copy(v6[24:], d6[:])
	for _, c := range []struct {
		ip   []byte
		want netip.Addr
	}{{v4, netip.MustParseAddr("192.0.2.7")}, {v6, netip.MustParseAddr("2001:db8::7")}} {
		got, err := Destination(c.ip)
		if err != nil || got != c.want {
			t.Errorf("Destination = %v, %v; want %v", got, err, c.want)
		}
	}
	for _, bad := range [][]byte{nil, v4[:19], v6[:39], {0x50, 0, 0}} {
		if _, err := Destination(bad); err == nil {
			t.Errorf("Destination(% x) accepted", bad)
		}
	}
}

func TestErrno(t *testing.T) {
	for _, c := range []struct {
		in   tcpip.Error
		want unix.Errno
	}{
		{&tcpip.ErrConnectionRefused{}, unix.ECONNREFUSED},
		{&tcpip.ErrConnectionReset{}, unix.ECONNRESET},
		{&tcpip.ErrTimeout{}, unix.ETIMEDOUT},
		{&tcpip.ErrWouldBlock{}, unix.EAGAIN},
		{&tcpip.ErrPortInUse{}, unix.EADDRINUSE},
		{&tcpip.ErrClosedForSend{}, unix.EPIPE},
		{&tcpip.ErrMalformedHeader{}, unix.EIO},
	} {
		if got := Errno(c.in); got != c.want {
			t.Errorf("Errno(%T) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestNew checks the stack's options: CUBIC by default, Reno on request,
// an unknown algorithm refused, SACK on.
func TestNew(t *testing.T) {
	for _, cc := range []string{"", "reno", "cubic"} {
		s, err := New(Config{MTU: 1500, CongestionControl: cc})
		if err != nil {
			t.Fatalf("%q: %v", cc, err)
		}
		var got tcpip.CongestionControlOption
		if err := s.s.TransportProtocolOption(6, &got); err != nil {
			t.Fatal(err)
		}
		want := cc
		if want == "" {
			want = "cubic"
		}
		if string(got) != want {
			t.Errorf("%q: congestion control %q", cc, got)
		}
		var sack tcpip.TCPSACKEnabled
		if err := s.s.TransportProtocolOption(6, &sack); err != nil || !bool(sack) {
			t.Errorf("SACK %v, %v", sack, err)
		}
		if err := s.AddAddress(netip.MustParseAddr("192.0.2.1")); err != nil {
			t.Fatal(err)
		}
		if err := s.AddAddress(netip.MustParseAddr("192.0.2.1")); err != nil {
			t.Errorf("adding an address twice: %v", err)
		}
		s.Close()
	}
	if _, err := New(Config{MTU: 1500, CongestionControl: "bbr"}); err == nil {
		t.Error("unknown congestion control accepted")
	}
	if _, err := New(Config{MTU: 100}); err == nil {
		t.Error("MTU 100 accepted")
	}
}
