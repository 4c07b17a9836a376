package tap_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/wire/packet"
	"github.com/bypassd/bypassd/tap"
)

// fallback is a TAP device with its steering on the A end of a pair.
type fallback struct {
	p   *netlab.Pair
	dev *tap.Device
	s   *tap.Steering
}

func newFallback(t *testing.T) *fallback {
	t.Helper()
	netlab.RequirePriv(t)
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	fb := &fallback{p: p}
	err := p.A.NS.Do(func() error {
		var err error
		if fb.dev, err = tap.Create(tap.DeviceConfig{Name: tap.DeviceName(p.A.Index, 0), MAC: p.A.MAC, MTU: p.A.MTU}); err != nil {
			return err
		}
		if fb.s, err = tap.NewSteering(netns.None(), p.A.Index, fb.dev); err != nil {
			_ = fb.dev.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("TAP fallback on %s: %v", p.A.Name, err)
	}
	t.Cleanup(func() {
		if err := fb.s.Close(); err != nil {
			t.Errorf("close steering: %v", err)
		}
		if err := fb.dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return fb
}

func (fb *fallback) add(t *testing.T, f qp.Flow) {
	t.Helper()
	if err := fb.s.AddFlow(f); err != nil {
		t.Fatalf("add flow %v: %v", f, err)
	}
}

// tc runs tc in A's namespace and returns its output.
func (fb *fallback) tc(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := fb.p.A.NS.Command(ctx, "tc", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("tc %v: %v: %s", args, err, out)
	}
	return string(out)
}

// readUDP waits for a frame on the TAP and returns it parsed.
func (fb *fallback) readUDP(t *testing.T, timeout time.Duration) (packet.Frame, bool) {
	t.Helper()
	buf := make([]byte, 4096)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		fds := []unix.PollFd{{Fd: int32(fb.dev.FD()), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, 50); err != nil && err != unix.EINTR {
			t.Fatalf("poll: %v", err)
		}
		n, err := fb.dev.Read(buf)
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			t.Fatalf("read TAP: %v", err)
		}
		var f packet.Frame
		if packet.Parse(buf[:n], &f) == nil && (f.Kind == packet.KindUDP || f.Kind == packet.KindFragment) {
			return f, true
		}
	}
	return packet.Frame{}, false
}

func udpFlow(dst netip.AddrPort) qp.Flow { return qp.Flow{Proto: unix.IPPROTO_UDP, Dst: dst} }

// sendFrom sends one datagram from B (bound to src, port 0 = any) to dst.
func (fb *fallback) sendFrom(t *testing.T, src, dst netip.AddrPort, n int) {
	t.Helper()
	c := fb.p.B.NS.ListenUDP(t, src)
	defer c.Close()
	if _, err := c.WriteToUDPAddrPort(make([]byte, n), dst); err != nil {
		t.Fatalf("send to %v: %v", dst, err)
	}
}

// kernelGets reports whether a kernel socket on A bound to addr receives a
// datagram sent by send.
func (fb *fallback) kernelGets(t *testing.T, addr netip.AddrPort, send func()) bool {
	t.Helper()
	c := fb.p.A.NS.ListenUDP(t, addr)
	defer c.Close()
	send()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, _, err := c.ReadFromUDPAddrPort(make([]byte, 2048))
	return err == nil
}

// TestSteering: offloaded flows (3-tuple, 5-tuple, IPv4 and IPv6) reach the
// TAP, everything else reaches the kernel (UDP to the port of a TCP flow
// included), fragments of an offloaded
// address reach the TAP, frames written to the TAP leave through the NIC,
// tc lists exactly our filters, and Close leaves nothing.
func TestSteering(t *testing.T) {
	fb := newFallback(t)
	a4, a6, b4, b6 := fb.p.A.Addr4(), fb.p.A.Addr6(), fb.p.B.Addr4(), fb.p.B.Addr6()
	fb.add(t, udpFlow(netip.AddrPortFrom(a4, 5000)))
	fb.add(t, qp.Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(a4, 5001), Src: netip.AddrPortFrom(b4, 6001)})
	fb.add(t, udpFlow(netip.AddrPortFrom(a6, 5000)))
	fb.add(t, udpFlow(netip.AddrPortFrom(a4, 5000+256))) // same bucket as 5000
	tcpFlow := qp.Flow{Proto: unix.IPPROTO_TCP, Dst: netip.AddrPortFrom(a4, 5003)}
	fb.add(t, tcpFlow)

	for _, c := range []struct {
		src, dst netip.AddrPort
	}{
		{netip.AddrPortFrom(b4, 0), netip.AddrPortFrom(a4, 5000)},
		{netip.AddrPortFrom(b4, 0), netip.AddrPortFrom(a4, 5256)},
		{netip.AddrPortFrom(b4, 6001), netip.AddrPortFrom(a4, 5001)},
		{netip.AddrPortFrom(b6, 0), netip.AddrPortFrom(a6, 5000)},
	} {
		fb.sendFrom(t, c.src, c.dst, 100)
		f, ok := fb.readUDP(t, 2*time.Second)
		if !ok || f.Dst != c.dst || f.Kind != packet.KindUDP {
			t.Fatalf("datagram %v → %v: TAP got %v %v (ok=%v), want it", c.src, c.dst, f.Kind, f.Dst, ok)
		}
	}
	// Not offloaded: the kernel gets them, the TAP does not.
	for _, c := range []struct {
		src, dst netip.AddrPort
	}{
		{netip.AddrPortFrom(b4, 0), netip.AddrPortFrom(a4, 5002)},
		{netip.AddrPortFrom(b4, 6002), netip.AddrPortFrom(a4, 5001)}, // other source port
		{netip.AddrPortFrom(b6, 0), netip.AddrPortFrom(a6, 5001)},
		{netip.AddrPortFrom(b4, 0), netip.AddrPortFrom(a4, 5003)}, // UDP to a TCP flow's port
	} {
		if !fb.kernelGets(t, c.dst, func() { fb.sendFrom(t, c.src, c.dst, 100) }) {
			t.Errorf("datagram %v → %v did not reach the kernel", c.src, c.dst)
		}
	}
	if f, ok := fb.readUDP(t, 100*time.Millisecond); ok {
		t.Errorf("TAP got a datagram to %v that is not offloaded", f.Dst)
	}
	// Fragments of an offloaded address go to the TAP, all of them.
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(a4, 5000), netip.AddrPortFrom(a6, 5000)} {
		fb.sendFrom(t, netip.AddrPortFrom(netip.IPv6Unspecified(), 0), dst, 3000)
		for i := 0; i < 3; i++ {
			f, ok := fb.readUDP(t, 2*time.Second)
			if !ok || f.Kind != packet.KindFragment || f.Dst.Addr() != dst.Addr() {
				t.Fatalf("fragment %d of a datagram to %v: TAP got %v %v (ok=%v)", i, dst, f.Kind, f.Dst, ok)
			}
		}
	}

	// A frame written to the TAP leaves through the NIC.
	peer := fb.p.B.NS.ListenUDP(t, netip.AddrPortFrom(b4, 0))
	to := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	tmpl, err := packet.NewTemplate(fb.p.A.MAC, fb.p.B.MAC, netip.AddrPortFrom(a4, 5000), to, 1500, packet.TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, 2048)
	n, err := tmpl.BuildFrame(frame, []byte("through the TAP"), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.dev.Write(frame[:n]); err != nil {
		t.Fatalf("write the TAP: %v", err)
	}
	_ = peer.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	m, from, err := peer.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:m]) != "through the TAP" || from.Port() != 5000 {
		t.Fatalf("peer got %q from %v, %v", buf[:m], from, err)
	}

	// The kernel lists exactly our flows, and tc shows them.
	flows, err := fb.s.Flows()
	if err != nil {
		t.Fatal(err)
	}
	want := map[qp.Flow]bool{
		udpFlow(netip.AddrPortFrom(a4, 5000)): true, udpFlow(netip.AddrPortFrom(a4, 5256)): true,
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(a4, 5001), Src: netip.AddrPortFrom(b4, 6001)}: true,
		udpFlow(netip.AddrPortFrom(a6, 5000)): true, tcpFlow: true,
	}
	if len(flows) != len(want) {
		t.Errorf("Flows() = %v, want %d flows", flows, len(want))
	}
	for _, f := range flows {
		if !want[f] {
			t.Errorf("unexpected flow %v", f)
		}
	}
	show := fb.tc(t, "filter", "show", "dev", fb.p.A.Name, "ingress")
	t.Logf("tc filter show dev %s ingress:\n%s", fb.p.A.Name, show)
	if got := strings.Count(show, "action order 1: mirred (Egress Redirect to device "+fb.dev.Name()+")"); got != 5+2 {
		t.Errorf("tc lists %d redirects to %s, want 7 (5 flows, 2 fragment filters):\n%s", got, fb.dev.Name(), show)
	}

	// A standby steering keeps its flow filters but takes no fragments.
	redirects := func() int {
		return strings.Count(fb.tc(t, "filter", "show", "dev", fb.p.A.Name, "ingress"), "Egress Redirect to device "+fb.dev.Name())
	}
	if err := fb.s.SetActive(false); err != nil {
		t.Fatal(err)
	}
	if got := redirects(); got != 5 {
		t.Errorf("standby: %d redirects, want the 5 flow filters", got)
	}
	if err := fb.s.SetActive(true); err != nil {
		t.Fatal(err)
	}
	if got := redirects(); got != 7 {
		t.Errorf("active again: %d redirects, want 7", got)
	}

	// Deleting flows and closing leaves nothing behind.
	for f := range want {
		if err := fb.s.DeleteFlow(f); err != nil {
			t.Fatalf("delete %v: %v", f, err)
		}
	}
	if show := fb.tc(t, "filter", "show", "dev", fb.p.A.Name, "ingress"); strings.TrimSpace(show) != "" {
		t.Errorf("filters left after the last flow:\n%s", show)
	}
	if err := fb.s.Close(); err != nil {
		t.Fatal(err)
	}
	if show := fb.tc(t, "qdisc", "show", "dev", fb.p.A.Name, "ingress"); strings.TrimSpace(show) != "" {
		t.Errorf("ingress qdisc left after close:\n%s", show)
	}
}

// TestNoSocketTimestamps: a TAP descriptor is not a socket, so
// SO_TIMESTAMPING cannot be asked of it; the TAP path's receive time is the
// ring engine's software timestamp.
func TestNoSocketTimestamps(t *testing.T) {
	fb := newFallback(t)
	err := unix.SetsockoptInt(fb.dev.FD(), unix.SOL_SOCKET, unix.SO_TIMESTAMPING, unix.SOF_TIMESTAMPING_RX_SOFTWARE|unix.SOF_TIMESTAMPING_SOFTWARE)
	if err != unix.ENOTSOCK {
		t.Fatalf("SO_TIMESTAMPING on a TAP descriptor: %v, want ENOTSOCK", err)
	}
}

// TestDeleteFlows: deleting some of an address's flows removes their
// filters; deleting the rest removes the address's tables too.
func TestDeleteFlows(t *testing.T) {
	fb := newFallback(t)
	var flows []qp.Flow
	for i := 0; i < 50; i++ {
		f := udpFlow(netip.AddrPortFrom(fb.p.A.Addr4(), uint16(7000+i)))
		fb.add(t, f)
		flows = append(flows, f)
	}
	if err := fb.s.DeleteFlows(flows[:40]); err != nil {
		t.Fatal(err)
	}
	if got, err := fb.s.Flows(); err != nil || len(got) != 10 {
		t.Fatalf("after deleting 40 of 50: %d flows, %v", len(got), err)
	}
	if err := fb.s.DeleteFlows(flows[40:]); err != nil {
		t.Fatal(err)
	}
	if show := fb.tc(t, "filter", "show", "dev", fb.p.A.Name, "ingress"); strings.TrimSpace(show) != "" {
		t.Errorf("filters left after deleting every flow:\n%s", show)
	}
	// The address comes back cleanly.
	fb.add(t, flows[0])
	if got, err := fb.s.Flows(); err != nil || len(got) != 1 || got[0] != flows[0] {
		t.Fatalf("re-added flow: %v, %v", got, err)
	}
}
