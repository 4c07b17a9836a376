package route

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestMulticastMAC(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ ip, mac string }{
		{"224.0.0.1", "01:00:5e:00:00:01"},
		{"239.255.255.250", "01:00:5e:7f:ff:fa"},
		{"224.129.2.3", "01:00:5e:01:02:03"}, // bit 24 is dropped
		{"::ffff:224.1.2.3", "01:00:5e:01:02:03"},
		{"ff02::1", "33:33:00:00:00:01"},
		{"ff02::1:ff12:3456", "33:33:ff:12:34:56"},
		{"ff0e::dead:beef", "33:33:de:ad:be:ef"},
	} {
		got, err := MulticastMAC(netip.MustParseAddr(tc.ip))
		if err != nil {
			t.Errorf("MulticastMAC(%s): %v", tc.ip, err)
			continue
		}
		if got.String() != tc.mac {
			t.Errorf("MulticastMAC(%s) = %s, want %s", tc.ip, got, tc.mac)
		}
	}
	for _, ip := range []string{"10.0.0.1", "2001:db8::1", "255.255.255.255"} {
		if _, err := MulticastMAC(netip.MustParseAddr(ip)); err == nil {
			t.Errorf("MulticastMAC(%s): no error for a unicast/broadcast address", ip)
		}
	}
	if _, err := MulticastMAC(netip.Addr{}); err == nil {
		t.Error("MulticastMAC(zero): no error")
	}
}

func TestNeedsOif(t *testing.T) {
	t.Parallel()
	for ip, want := range map[string]bool{
		"224.0.0.1":       true,
		"255.255.255.255": true,
		"ff02::1":         true,
		"fe80::1":         true,
		"10.1.2.3":        false,
		"10.1.2.255":      false, // directed broadcast: the routing table knows it
		"2001:db8::1":     false,
	} {
		if got := needsOif(netip.MustParseAddr(ip)); got != want {
			t.Errorf("needsOif(%s) = %v, want %v", ip, got, want)
		}
	}
}

func TestRoutePrefix(t *testing.T) {
	t.Parallel()
	rtmsg := func(family, dstLen byte, dst []byte) []byte {
		b := make([]byte, unix.SizeofRtMsg)
		b[0], b[1] = family, dstLen
		if dst != nil {
			l := 4 + len(dst)
			attr := []byte{byte(l), byte(l >> 8), byte(unix.RTA_DST), 0}
			attr = append(attr, dst...)
			for len(attr)%4 != 0 {
				attr = append(attr, 0)
			}
			b = append(b, attr...)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"v4", rtmsg(unix.AF_INET, 24, []byte{192, 0, 2, 0}), "192.0.2.0/24"},
		{"v4 host", rtmsg(unix.AF_INET, 32, []byte{192, 0, 2, 7}), "192.0.2.7/32"},
		{"v4 default", rtmsg(unix.AF_INET, 0, nil), "0.0.0.0/0"},
		{"v6", rtmsg(unix.AF_INET6, 64, netip.MustParseAddr("2001:db8::").AsSlice()), "2001:db8::/64"},
		{"v6 default", rtmsg(unix.AF_INET6, 0, nil), "::/0"},
		{"missing dst", rtmsg(unix.AF_INET, 24, nil), ""},
		{"short", []byte{2, 24}, ""},
		{"unknown family", rtmsg(99, 0, nil), ""},
	} {
		p, ok := routePrefix(tc.msg)
		if tc.want == "" {
			if ok {
				t.Errorf("%s: got %s, want no prefix", tc.name, p)
			}
			continue
		}
		if !ok || p.String() != tc.want {
			t.Errorf("%s: got %s (ok=%v), want %s", tc.name, p, ok, tc.want)
		}
	}
}

// Bad input is rejected before any socket or namespace is touched, so this
// needs no privilege.
func TestReservePortBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		network string
		addr    string
	}{
		{"tcp", "127.0.0.1:0"},
		{"udp", "127.0.0.1:0"},
		{"udp4", "[::1]:0"},
		{"udp6", "127.0.0.1:0"},
		{"udp6", "[::ffff:127.0.0.1]:0"},
		{"udp4", "invalid"},
	} {
		var ap netip.AddrPort
		if tc.addr != "invalid" {
			ap = netip.MustParseAddrPort(tc.addr)
		}
		r, err := ReservePort(netns.None(), tc.network, ap)
		if err == nil {
			r.Close()
			t.Errorf("ReservePort(%s, %s): no error", tc.network, tc.addr)
			continue
		}
		if !errors.Is(err, unix.EINVAL) {
			t.Errorf("ReservePort(%s, %s): %v, want EINVAL", tc.network, tc.addr, err)
		}
	}
}

// A route change leaves the cache alone unless its prefix contains a cached
// destination or a resolution is in progress.
func TestRouteEventFilter(t *testing.T) {
	t.Parallel()
	cached := netip.MustParseAddr("192.0.2.7")
	for _, tc := range []struct {
		name    string
		msg     []byte
		pending string
		bump    bool
	}{
		{"unrelated", rtmsgFor(t, "203.0.113.0/24"), "", false},
		{"other family", rtmsgFor(t, "2001:db8::/32"), "", false},
		{"covering", rtmsgFor(t, "192.0.2.0/24"), "", true},
		{"host", rtmsgFor(t, "192.0.2.7/32"), "", true},
		{"default", rtmsgFor(t, "0.0.0.0/0"), "", true},
		{"covering a pending resolution", rtmsgFor(t, "203.0.113.0/24"), "203.0.113.5", true},
		{"unrelated to a pending resolution", rtmsgFor(t, "198.51.100.0/24"), "203.0.113.5", false},
		{"unparsable", []byte{1}, "", true},
	} {
		r := &Resolver{log: zap.NewNop(), cache: map[netip.Addr]Next{cached: {}}, nh: map[netip.Addr]*nhEntry{}, pending: map[netip.Addr]int{}}
		if tc.pending != "" {
			r.pending[netip.MustParseAddr(tc.pending)] = 1
		}
		r.routeEvent(&syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWROUTE}, Data: tc.msg})
		if bumped := r.Generation() != 0; bumped != tc.bump {
			t.Errorf("%s: bumped=%v, want %v", tc.name, bumped, tc.bump)
		}
		if _, kept := r.cache[cached]; kept == tc.bump {
			t.Errorf("%s: cache kept=%v after bump=%v", tc.name, kept, tc.bump)
		}
	}
}

// rtmsgFor builds an RTM_NEWROUTE body for prefix.
func rtmsgFor(t *testing.T, prefix string) []byte {
	t.Helper()
	p := netip.MustParsePrefix(prefix)
	fam := byte(unix.AF_INET)
	if p.Addr().Is6() {
		fam = unix.AF_INET6
	}
	b := make([]byte, unix.SizeofRtMsg)
	b[0], b[1] = fam, byte(p.Bits())
	if p.Bits() > 0 {
		dst := p.Addr().AsSlice()
		l := 4 + len(dst)
		b = append(b, byte(l), byte(l>>8), byte(unix.RTA_DST), 0)
		b = append(b, dst...)
	}
	return b
}

func TestNewResolverBadIndex(t *testing.T) {
	t.Parallel()
	if _, err := NewResolver(netns.None(), 0, nil); err == nil {
		t.Fatal("NewResolver(ifindex 0): no error")
	}
}
