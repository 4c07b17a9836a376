package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// waitLimit bounds waits for the kernel in these tests; it is a hang guard,
// not a performance assertion.
const waitLimit = 10 * time.Second

// newLab returns a pair with real ARP/ND and a resolver on A's end.
func newLab(t *testing.T) (*netlab.Pair, *Resolver) {
	t.Helper()
	p := netlab.NewPair(t, netlab.Options{})
	r, err := NewResolver(p.A.NS.Handle(), p.A.Index, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return p, r
}

func resolveCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// kernelNeigh returns A's kernel neighbour entry for ip, if any.
func kernelNeigh(t *testing.T, l *netlab.Link, ip netip.Addr) (netlink.Neigh, bool) {
	t.Helper()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	list, err := l.NS.Netlink().NeighList(l.Index, fam)
	if err != nil {
		t.Fatalf("list neighbours of %s: %v", l.Name, err)
	}
	for _, n := range list {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n, true
		}
	}
	return netlink.Neigh{}, false
}

// waitGen waits until the resolver's generation moved past old.
func waitGen(t *testing.T, r *Resolver, old uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		if g := r.Generation(); g != old {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("generation still %d after %v", old, waitLimit)
		}
		time.Sleep(time.Millisecond)
	}
}

func ipCmd(t *testing.T, l *netlab.Link, args ...string) {
	t.Helper()
	out, err := l.NS.Command(context.Background(), "ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s in %s: %v: %s", strings.Join(args, " "), l.NS.Name, err, out)
	}
}

// unusedHost returns an address of l's subnet that neither end owns.
func unusedHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	for range 77 {
		a = a.Next()
	}
	return a
}

func TestResolveOnLink(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	for _, fam := range []struct {
		name     string
		dst, src netip.Addr
	}{
		{"IPv4", p.B.Addr4(), p.A.Addr4()},
		{"IPv6", p.B.Addr6(), p.A.Addr6()},
	} {
		t.Run(fam.name, func(t *testing.T) {
			if n, ok := kernelNeigh(t, p.A, fam.dst); ok {
				t.Fatalf("precondition: A already has a neighbour entry for %s: %+v", fam.dst, n)
			}
			g := r.Generation()
			n, err := r.Resolve(resolveCtx(t), fam.dst)
			if err != nil {
				t.Fatal(err)
			}
			want := Next{Ifindex: p.A.Index, Src: fam.src, SrcMAC: p.A.MAC, DstMAC: p.B.MAC, MTU: p.A.MTU}
			if !equalNext(n, want) {
				t.Fatalf("Resolve(%s) = %+v, want %+v", fam.dst, n, want)
			}
			// The kernel did the resolution: its table now holds B's MAC.
			kn, ok := kernelNeigh(t, p.A, fam.dst)
			if !ok || !bytes.Equal(kn.HardwareAddr, p.B.MAC) {
				t.Fatalf("kernel neighbour entry for %s after Resolve: %+v (present %v), want MAC %s", fam.dst, kn, ok, p.B.MAC)
			}
			// Cached: same answer, and the caller cannot corrupt the cache.
			n.DstMAC[0] ^= 0xff
			again, err := r.Resolve(resolveCtx(t), fam.dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.DstMAC, p.B.MAC) {
				t.Fatalf("second Resolve: DstMAC %s, want %s", again.DstMAC, p.B.MAC)
			}
			if r.Generation() < g {
				t.Fatalf("generation went backwards: %d -> %d", g, r.Generation())
			}
		})
	}
	t.Run("IPv4-mapped", func(t *testing.T) {
		n, err := r.Resolve(resolveCtx(t), netip.AddrFrom16(p.B.Addr4().As16()))
		if err != nil {
			t.Fatal(err)
		}
		if n.Src != p.A.Addr4() || !bytes.Equal(n.DstMAC, p.B.MAC) {
			t.Fatalf("Resolve(::ffff:%s) = %+v", p.B.Addr4(), n)
		}
	})
	t.Run("IPv6 link-local", func(t *testing.T) {
		ll := linkLocal(t, p.B)
		src := linkLocal(t, p.A) // usable as a source before resolving
		n, err := r.Resolve(resolveCtx(t), ll)
		if err != nil {
			t.Fatal(err)
		}
		if n.Src != src || !bytes.Equal(n.DstMAC, p.B.MAC) || n.Gateway.IsValid() {
			t.Fatalf("Resolve(%s) = %+v, want source %s and B's MAC", ll, n, src)
		}
		if _, err := r.Resolve(resolveCtx(t), ll.WithZone(p.A.Name)); err != nil {
			t.Fatalf("Resolve with the ring's zone: %v", err)
		}
		_, err = r.Resolve(resolveCtx(t), ll.WithZone("lo"))
		if !errors.Is(err, unix.ENETUNREACH) {
			t.Fatalf("Resolve with a foreign zone: %v, want ENETUNREACH", err)
		}
	})
}

// linkLocal returns l's IPv6 link-local address once it is usable: the
// kernel adds it when the link comes up, briefly tentative even without DAD.
func linkLocal(t *testing.T, l *netlab.Link) netip.Addr {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		link, err := l.NS.Netlink().LinkByIndex(l.Index)
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := l.NS.Netlink().AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return ip
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no usable IPv6 link-local address after %v: %v", l.Name, waitLimit, addrs)
		}
		time.Sleep(time.Millisecond)
	}
}

func equalNext(a, b Next) bool {
	return a.Ifindex == b.Ifindex && a.Src == b.Src && a.Gateway == b.Gateway &&
		bytes.Equal(a.SrcMAC, b.SrcMAC) && bytes.Equal(a.DstMAC, b.DstMAC) && a.MTU == b.MTU
}

func TestResolveConcurrent(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := p.B.Addr4()
			if i%2 == 1 {
				dst = p.B.Addr6()
			}
			n, err := r.Resolve(resolveCtx(t), dst)
			if err == nil && !bytes.Equal(n.DstMAC, p.B.MAC) {
				err = fmt.Errorf("Resolve(%s): DstMAC %s, want %s", dst, n.DstMAC, p.B.MAC)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestResolveGateway(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	h := p.A.NS.Netlink()
	// Documentation prefixes: only ARP/ND for the gateway (B) goes on the wire.
	for _, rt := range []struct {
		dst string
		gw  netip.Addr
	}{
		{"192.0.2.0/24", p.B.Addr4()},
		{"2001:db8:7::/64", p.B.Addr6()},
	} {
		pfx := netip.MustParsePrefix(rt.dst)
		err := h.RouteAdd(&netlink.Route{
			LinkIndex: p.A.Index,
			Dst:       &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())},
			Gw:        rt.gw.AsSlice(),
		})
		if err != nil {
			t.Fatalf("add route %s via %s: %v", rt.dst, rt.gw, err)
		}
	}
	for _, tc := range []struct {
		dst      string
		src, gw  netip.Addr
		wantKind string
	}{
		{"192.0.2.7", p.A.Addr4(), p.B.Addr4(), "IPv4"},
		{"2001:db8:7::7", p.A.Addr6(), p.B.Addr6(), "IPv6"},
	} {
		n, err := r.Resolve(resolveCtx(t), netip.MustParseAddr(tc.dst))
		if err != nil {
			t.Fatalf("%s: %v", tc.wantKind, err)
		}
		want := Next{Ifindex: p.A.Index, Src: tc.src, Gateway: tc.gw, SrcMAC: p.A.MAC, DstMAC: p.B.MAC, MTU: p.A.MTU}
		if !equalNext(n, want) {
			t.Fatalf("Resolve(%s) = %+v, want %+v", tc.dst, n, want)
		}
		if _, ok := kernelNeigh(t, p.A, netip.MustParseAddr(tc.dst)); ok {
			t.Fatalf("a neighbour entry for %s (beyond the gateway) exists", tc.dst)
		}
	}

	// A route MTU is reported, capped by nothing else.
	err := h.RouteAdd(&netlink.Route{
		LinkIndex: p.A.Index,
		Dst:       &net.IPNet{IP: net.IP{198, 51, 100, 0}, Mask: net.CIDRMask(24, 32)},
		Gw:        p.B.Addr4().AsSlice(),
		MTU:       1300,
	})
	if err != nil {
		t.Fatalf("add route with mtu: %v", err)
	}
	n, err := r.Resolve(resolveCtx(t), netip.MustParseAddr("198.51.100.1"))
	if err != nil {
		t.Fatal(err)
	}
	if n.MTU != 1300 {
		t.Fatalf("route MTU: got %d, want 1300", n.MTU)
	}
}

func TestResolveOtherInterface(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)

	// A's own address is delivered via lo.
	_, err := r.Resolve(resolveCtx(t), p.A.Addr4())
	if !errors.Is(err, unix.ENETUNREACH) || !strings.Contains(err.Error(), "lo") {
		t.Fatalf("Resolve(own address): %v, want ENETUNREACH naming lo", err)
	}

	// A second veth pair inside A (both ends there) owns another subnet.
	h := p.A.NS.Netlink()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "rtother0"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "rtother1"}); err != nil {
		t.Fatalf("create second veth in %s: %v", p.A.NS.Name, err)
	}
	other, err := h.LinkByName("rtother0")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("192.168.77.1/24")
	if err := h.AddrAdd(other, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(other); err != nil {
		t.Fatal(err)
	}
	_, err = r.Resolve(resolveCtx(t), netip.MustParseAddr("192.168.77.2"))
	if !errors.Is(err, unix.ENETUNREACH) || !strings.Contains(err.Error(), "rtother0") {
		t.Fatalf("Resolve via another interface: %v, want ENETUNREACH naming rtother0", err)
	}

	// No route at all.
	_, err = r.Resolve(resolveCtx(t), netip.MustParseAddr("203.0.113.9"))
	if !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("Resolve without a route: %v, want ENETUNREACH", err)
	}
}

func TestResolveUnreachable(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	for _, dst := range []netip.Addr{unusedHost(p.A.IPv4), unusedHost(p.A.IPv6)} {
		t.Run(dst.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := r.Resolve(ctx, dst)
			if !errors.Is(err, unix.EHOSTUNREACH) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Resolve(%s): %v, want EHOSTUNREACH after the deadline", dst, err)
			}
			for _, s := range []string{dst.String(), p.A.Name, "is the peer up?"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestResolveCanceled(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := r.Resolve(ctx, unusedHost(p.A.IPv4))
	if !errors.Is(err, context.Canceled) || errors.Is(err, unix.EHOSTUNREACH) {
		t.Fatalf("Resolve with a canceled context: %v, want context.Canceled", err)
	}
}

func TestNeighbourChangeBumpsGeneration(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	dst := p.B.Addr4()
	// Read before Resolve, as the engine does: a change during Resolve
	// must not go unnoticed.
	g := r.Generation()
	if _, err := r.Resolve(resolveCtx(t), dst); err != nil {
		t.Fatal(err)
	}
	newMAC := net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x20, 0x30}
	ipCmd(t, p.A, "neigh", "replace", dst.String(), "lladdr", newMAC.String(), "dev", p.A.Name, "nud", "reachable")
	waitGen(t, r, g)
	n, err := r.Resolve(resolveCtx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(n.DstMAC, newMAC) {
		t.Fatalf("after neighbour change: DstMAC %s, want %s", n.DstMAC, newMAC)
	}
}

func TestLinkChangeBumpsGeneration(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	dst := p.B.Addr4()
	g := r.Generation()
	if _, err := r.Resolve(resolveCtx(t), dst); err != nil {
		t.Fatal(err)
	}
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: p.A.Index}}
	if err := p.A.NS.Netlink().LinkSetMTU(link, 1400); err != nil {
		t.Fatal(err)
	}
	g = waitGen(t, r, g)
	n, err := r.Resolve(resolveCtx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	if n.MTU != 1400 {
		t.Fatalf("after MTU change: MTU %d, want 1400", n.MTU)
	}

	mac := net.HardwareAddr{0x02, 0x00, 0x5e, 0xaa, 0xbb, 0xcc}
	if err := p.A.NS.Netlink().LinkSetHardwareAddr(link, mac); err != nil {
		t.Fatal(err)
	}
	g = waitGen(t, r, g)
	n, err = r.Resolve(resolveCtx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(n.SrcMAC, mac) {
		t.Fatalf("after MAC change: SrcMAC %s, want %s", n.SrcMAC, mac)
	}

	if err := p.A.NS.Netlink().LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	waitGen(t, r, g)
	_, err = r.Resolve(resolveCtx(t), dst)
	if !errors.Is(err, unix.ENETDOWN) && !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("Resolve on a down interface: %v, want ENETDOWN or ENETUNREACH", err)
	}
}

func TestRouteChangeBumpsGeneration(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	ipCmd(t, p.A, "route", "add", "192.0.2.0/24", "via", p.B.Addr4().String())
	dst := netip.MustParseAddr("192.0.2.9")
	g := r.Generation()
	n, err := r.Resolve(resolveCtx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	if n.MTU != p.A.MTU {
		t.Fatalf("MTU %d, want the link's %d", n.MTU, p.A.MTU)
	}
	ipCmd(t, p.A, "route", "replace", "192.0.2.0/24", "via", p.B.Addr4().String(), "mtu", "1280")
	waitGen(t, r, g)
	n, err = r.Resolve(resolveCtx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	if n.MTU != 1280 {
		t.Fatalf("after route change: MTU %d, want 1280", n.MTU)
	}
}

func TestResolveBroadcastMulticast(t *testing.T) {
	t.Parallel()
	p, r := newLab(t)
	last := netip.AddrFrom4([4]byte{p.A.Addr4().As4()[0], p.A.Addr4().As4()[1], p.A.Addr4().As4()[2], 255})
	for _, tc := range []struct {
		dst string
		src netip.Addr
		mac string
	}{
		{"255.255.255.255", p.A.Addr4(), "ff:ff:ff:ff:ff:ff"},
		{last.String(), p.A.Addr4(), "ff:ff:ff:ff:ff:ff"},
		{"239.1.2.3", p.A.Addr4(), "01:00:5e:01:02:03"},
		{"ff02::1:3", netip.Addr{}, "33:33:00:01:00:03"},
	} {
		n, err := r.Resolve(resolveCtx(t), netip.MustParseAddr(tc.dst))
		if err != nil {
			t.Fatalf("Resolve(%s): %v", tc.dst, err)
		}
		if n.DstMAC.String() != tc.mac || n.Gateway.IsValid() || n.Ifindex != p.A.Index || !n.Src.IsValid() {
			t.Fatalf("Resolve(%s) = %+v, want DstMAC %s via %s", tc.dst, n, tc.mac, p.A.Name)
		}
		if tc.src.IsValid() && n.Src != tc.src {
			t.Fatalf("Resolve(%s): Src %s, want %s", tc.dst, n.Src, tc.src)
		}
	}
}

// watchers counts the resolvers' notification goroutines in this process
// (by creator, which is known even before a goroutine first runs).
func watchers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "created by github.com/bypassd/bypassd/ring/route.NewResolver ")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Not parallel: it counts the goroutines of the whole process.
func TestCloseLeaksNothing(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	before := runtime.NumGoroutine()
	w0 := watchers()

	r, err := NewResolver(p.A.NS.Handle(), p.A.Index, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() }) // if the test fails before its own Close
	if got := watchers(); got != w0+1 {
		t.Fatalf("%d notification goroutines for one resolver, want 1", got-w0)
	}
	if _, err := r.Resolve(resolveCtx(t), p.B.Addr4()); err != nil {
		t.Fatal(err)
	}
	// A resolution waiting for a neighbour that never answers is woken by Close.
	errc := make(chan error, 1)
	go func() {
		_, err := r.Resolve(context.Background(), unusedHost(p.A.IPv4))
		errc <- err
	}()
	waitPending(t, r)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("waiting Resolve after Close: %v, want net.ErrClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := r.Resolve(resolveCtx(t), p.B.Addr4()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Resolve after Close: %v, want net.ErrClosed", err)
	}
	// Close waits for the watcher's wg.Done, which its deferred call runs
	// just before the goroutine ends: the goroutine may still be listed
	// for a moment after Close returns.
	deadline := time.Now().Add(waitLimit)
	for got := watchers(); got != w0; got = watchers() {
		if time.Now().After(deadline) {
			t.Fatalf("%d notification goroutines after Close, want %d", got, w0)
		}
		time.Sleep(time.Millisecond)
	}
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d before, %d after Close\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

// waitPending waits until a resolution is waiting for a neighbour.
func waitPending(t *testing.T, r *Resolver) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		r.mu.Lock()
		n := len(r.nh)
		r.mu.Unlock()
		if n > 1 { // B (cached) plus the pending one
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no resolution became pending")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestNewResolverMissingInterface(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{})
	_, err := NewResolver(p.A.NS.Handle(), 999999, nil)
	if err == nil || !strings.Contains(err.Error(), "999999") {
		t.Fatalf("NewResolver(missing ifindex): %v, want an error naming the index", err)
	}
}

// Lost notifications (receive buffer overrun) drop the whole cache, and the
// resolver keeps following changes afterwards.
func TestNotificationOverrun(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{})
	core, logs := observer.New(zap.WarnLevel)
	r, err := NewResolver(p.A.NS.Handle(), p.A.Index, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	dst := p.B.Addr4()
	g := r.Generation()
	if _, err := r.Resolve(resolveCtx(t), dst); err != nil {
		t.Fatal(err)
	}
	// The smallest buffer the kernel allows, then stall the watcher on the
	// resolver's lock while many notifications arrive.
	if err := r.sub.SetReceiveBufferSize(0, true); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	locked := true
	defer func() {
		if locked {
			r.mu.Unlock()
		}
	}()
	h := p.A.NS.Netlink()
	for i := range 200 {
		err := h.RouteAdd(&netlink.Route{
			LinkIndex: p.A.Index,
			Dst:       &net.IPNet{IP: net.IP{198, 18, byte(i), 0}, Mask: net.CIDRMask(24, 32)},
			Gw:        dst.AsSlice(),
		})
		if err != nil {
			t.Fatalf("add route %d: %v", i, err)
		}
	}
	r.mu.Unlock()
	locked = false

	deadline := time.Now().Add(waitLimit)
	for logs.FilterMessageSnippet("notifications lost").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no overrun reported; logs: %v", logs.All())
		}
		time.Sleep(time.Millisecond)
	}
	if r.Generation() == g {
		t.Fatal("generation unchanged after an overrun")
	}
	// Still following the kernel.
	g = r.Generation()
	if _, err := r.Resolve(resolveCtx(t), dst); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetMTU(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: p.A.Index}}, 1300); err != nil {
		t.Fatal(err)
	}
	waitGen(t, r, g)
	n, err := r.Resolve(resolveCtx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	if n.MTU != 1300 {
		t.Fatalf("MTU after overrun and change: %d, want 1300", n.MTU)
	}
}
