package route

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

func TestReservePort(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{})
	ns := p.A.NS.Handle()
	for _, tc := range []struct {
		network string
		ip      netip.Addr
	}{
		// A's addresses exist only inside A: binding them proves the socket
		// was created there.
		{"udp4", p.A.Addr4()},
		{"udp6", p.A.Addr6()},
		{"udp4", netip.IPv4Unspecified()},
		{"udp6", netip.IPv6Unspecified()},
	} {
		t.Run(tc.network+"-"+tc.ip.String(), func(t *testing.T) {
			res, err := ReservePort(ns, tc.network, netip.AddrPortFrom(tc.ip, 0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { res.Close() })
			got := res.Addr()
			if got.Addr() != tc.ip || got.Port() == 0 {
				t.Fatalf("Addr() = %s, want %s with a kernel-chosen port", got, tc.ip)
			}

			// The port is taken: a second reservation fails, naming it.
			_, err = ReservePort(ns, tc.network, got)
			if !errors.Is(err, unix.EADDRINUSE) || !strings.Contains(err.Error(), got.String()) {
				t.Fatalf("second ReservePort(%s): %v, want EADDRINUSE naming it", got, err)
			}
			// An ordinary socket cannot take it either.
			if err := bindIn(p.A, tc.network, got); !errors.Is(err, unix.EADDRINUSE) {
				t.Fatalf("plain bind to reserved %s: %v, want EADDRINUSE", got, err)
			}

			if err := res.Close(); err != nil {
				t.Fatal(err)
			}
			if err := res.Close(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("second Close: %v, want net.ErrClosed", err)
			}
			again := reserveAgain(t, p.A, tc.network, got)
			if err := again.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("rcvbuf", func(t *testing.T) {
		res, err := ReservePort(ns, "udp4", netip.AddrPortFrom(p.A.Addr4(), 0))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Close()
		if ParkStatus() == nil && !res.s.parked {
			t.Error("io_uring parks sockets here, but the reservation keeps a descriptor")
		}
		var size int
		if err := res.withFD(func(fd int) (err error) {
			size, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// The kernel doubles the request for its bookkeeping.
		if size > 2*reserveRcvBuf {
			t.Fatalf("SO_RCVBUF = %d, want at most %d", size, 2*reserveRcvBuf)
		}
	})

	t.Run("reuseaddr", func(t *testing.T) {
		reuse := ReserveOptions{ReuseAddr: true}
		first, err := ReservePort(ns, "udp4", netip.AddrPortFrom(p.A.Addr4(), 0), reuse)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		second, err := ReservePort(ns, "udp4", first.Addr(), reuse)
		if err != nil {
			t.Fatalf("second reservation with ReuseAddr: %v", err)
		}
		defer second.Close()
		// Sharing needs consent from both sides.
		if _, err := ReservePort(ns, "udp4", first.Addr()); !errors.Is(err, unix.EADDRINUSE) {
			t.Fatalf("reservation without ReuseAddr on a shared port: %v, want EADDRINUSE", err)
		}
		if _, err := ReservePort(ns, "udp4", first.Addr(), reuse, reuse); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("two option sets: %v, want EINVAL", err)
		}
	})

	t.Run("link-local", func(t *testing.T) {
		ll := linkLocal(t, p.A)
		if _, err := ReservePort(ns, "udp6", netip.AddrPortFrom(ll, 0)); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("link-local without zone: %v, want EINVAL", err)
		}
		res, err := ReservePort(ns, "udp6", netip.AddrPortFrom(ll.WithZone(p.A.Name), 0))
		if err != nil {
			t.Fatal(err)
		}
		if res.Addr().Addr().Zone() != p.A.Name {
			t.Errorf("Addr() = %s, want zone %s", res.Addr(), p.A.Name)
		}
		if err := res.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("not-assigned", func(t *testing.T) {
		// B's address does not exist in A.
		_, err := ReservePort(ns, "udp4", netip.AddrPortFrom(p.B.Addr4(), 0))
		if !errors.Is(err, unix.EADDRNOTAVAIL) {
			t.Fatalf("ReservePort of a foreign address: %v, want EADDRNOTAVAIL", err)
		}
	})
}

// bindIn binds a plain UDP socket in l's namespace and closes it.
func bindIn(l *netlab.Link, network string, ap netip.AddrPort) error {
	return l.NS.Do(func() error {
		c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// reserveAgain reserves ap right after it was released. Processes started
// concurrently by other tests hold inherited copies of the old socket until
// their exec completes, so EADDRINUSE is retried for a moment.
func reserveAgain(t *testing.T, l *netlab.Link, network string, ap netip.AddrPort) *Reservation {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		res, err := ReservePort(l.NS.Handle(), network, ap)
		if err == nil {
			return res
		}
		if !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
			t.Fatalf("ReservePort(%s) after Close: %v", ap, err)
		}
		time.Sleep(time.Millisecond)
	}
}
