//go:build verbs

package verbs

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/qp"
)

// Hardware tests: they need a ConnectX (or other raw-packet-capable RDMA)
// port and skip without one. They are not privilege tests:
// BYPASSD_REQUIRE_PRIV does not turn their skip into a failure, because no
// CI machine has the hardware. docs/hardware-testing.md says how to run
// them.

// requireDevice returns the interface named by BYPASSD_VERBS_IF, or skips.
func requireDevice(t *testing.T) string {
	t.Helper()
	ifname := os.Getenv("BYPASSD_VERBS_IF")
	if ifname == "" {
		t.Skip("hardware test: needs an RDMA NIC port with raw packet QPs (ConnectX); set BYPASSD_VERBS_IF=<interface> as root (docs/hardware-testing.md)")
	}
	return ifname
}

func openHW(t *testing.T) *Provider {
	t.Helper()
	p, err := Open(Config{Interface: requireDevice(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

// testFrame writes a 64-byte broadcast frame of the local experimental
// ethertype into b and returns its length: nothing on the wire reacts to it.
func testFrame(b []byte, src net.HardwareAddr, seq int) int {
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], 0x88b5)
	clear(b[14:64])
	binary.BigEndian.PutUint32(b[14:], uint32(seq))
	return 64
}

// sendAll posts n test frames on send queue q and waits for every completion.
func sendAll(t *testing.T, p *Provider, q, n int) {
	t.Helper()
	frames := make([]qp.Frame, 32)
	sent := 0
	deadline := time.Now().Add(10 * time.Second)
	for sent < n || p.TXPending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sent %d of %d, %d still pending after 10s (stats %+v)", sent, n, p.TXPending(), p.Stats())
		}
		if sent < n {
			k := p.AllocTX(frames[:min(len(frames), n-sent)])
			for i := 0; i < k; i++ {
				frames[i].Buf = frames[i].Buf[:testFrame(frames[i].Buf, p.mac, sent+i)]
				frames[i].SendQueue = q
			}
			posted, err := p.TXBurst(frames[:k])
			if err != nil {
				t.Fatal(err)
			}
			p.FreeTX(frames[posted:k])
			sent += posted
		}
		if p.Complete() == 0 && p.TXPending() > 0 {
			if _, err := p.Wait(10*time.Millisecond, -1); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestHWOpenClose(t *testing.T) {
	ifname := requireDevice(t)
	for i := 0; i < 2; i++ {
		p, err := Open(Config{Interface: ifname})
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		c := p.caps
		j, _ := json.MarshalIndent(c, "", "  ")
		t.Logf("caps %+v\n%s", p.Caps(), j)
		if !c.RawPacket || c.Device == "" {
			t.Errorf("caps of an open raw packet QP: %+v", c)
		}
		if err := p.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
}

func TestHWSend(t *testing.T) {
	p := openHW(t)
	sendAll(t, p, 0, 10000)
	if st := p.Stats(); st.TXPackets != 10000 || st.InvalidDescs != 0 {
		t.Fatalf("stats after 10000 sends: %+v", st)
	}
}

func TestHWFlowRules(t *testing.T) {
	p := openHW(t)
	addr := netip.MustParseAddr("192.0.2.1")
	if ifc, err := net.InterfaceByName(p.cfg.Interface); err == nil {
		if as, err := ifc.Addrs(); err == nil {
			for _, a := range as {
				if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
					addr, _ = netip.AddrFromSlice(n.IP.To4())
					break
				}
			}
		}
	}
	flows := []qp.Flow{
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(addr, 45678)},
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(addr, 45678), Src: netip.MustParseAddrPort("192.0.2.200:5000")},
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("239.1.2.3:45679")},
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[2001:db8::1]:45680")},
	}
	st := p.Steering()
	for _, f := range flows {
		if err := st.AddFlow(f); err != nil {
			t.Fatalf("add %s: %v", f, err)
		}
	}
	if got, _ := st.Flows(); len(got) != len(flows) || st.Healthy() != nil {
		t.Fatalf("flows %v, healthy %v", got, st.Healthy())
	}
	for _, f := range flows[:2] {
		if err := st.DeleteFlow(f); err != nil {
			t.Fatalf("delete %s: %v", f, err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatalf("close steering with two flows left: %v", err)
	}
}

// TestHWReceive needs traffic from another host: with
// BYPASSD_VERBS_RX_PORT=P it steers UDP port P of the interface's first IPv4
// address and waits 30 s for one datagram (send it with e.g.
// `sockperf ping-pong -i ADDR -p P` from a peer).
func TestHWReceive(t *testing.T) {
	port, _ := strconv.Atoi(os.Getenv("BYPASSD_VERBS_RX_PORT"))
	if port <= 0 {
		requireDevice(t)
		t.Skip("hardware test: set BYPASSD_VERBS_RX_PORT=<udp port> and send to it from another host")
	}
	p := openHW(t)
	ifc, err := net.InterfaceByName(p.cfg.Interface)
	if err != nil {
		t.Fatal(err)
	}
	as, _ := ifc.Addrs()
	var addr netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			addr, _ = netip.AddrFromSlice(n.IP.To4())
			break
		}
	}
	if !addr.IsValid() {
		t.Fatalf("interface %s has no IPv4 address", ifc.Name)
	}
	if err := p.Steering().AddFlow(qp.Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(addr, uint16(port))}); err != nil {
		t.Fatal(err)
	}
	frames := make([]qp.Frame, 16)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if n := p.RXBurst(frames); n > 0 {
			t.Logf("received %d frame(s); first %d bytes, hardware timestamp %d", n, len(frames[0].Buf), frames[0].HWTimestamp)
			if p.ts && frames[0].HWTimestamp == 0 {
				t.Error("timestamped CQ gave a zero timestamp")
			}
			p.ReleaseRX(frames[:n])
			return
		}
		if _, err := p.Wait(100*time.Millisecond, -1); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("nothing received on udp %s:%d in 30s", addr, port)
}

func TestHWRateLimit(t *testing.T) {
	p := openHW(t)
	pc := p.caps.Pacing
	if pc == nil {
		t.Skip("the device has no packet pacing for raw packet QPs")
	}
	rate := max(pc.MinKbps, 10_000)
	if err := p.SetRateLimit(1, qp.RateLimit{Kbps: rate}); err != nil {
		t.Fatal(err)
	}
	if len(p.sq) != 2 {
		t.Fatalf("%d send queues after pacing queue 1, want 2", len(p.sq))
	}
	start := time.Now()
	sendAll(t, p, 1, 2000) // 2000 × 64 bytes (84 on the wire) at 10 Mbit/s ≈ 134 ms
	t.Logf("2000 frames paced at %d kbit/s in %v", rate, time.Since(start))
	if err := p.SetRateLimit(1, qp.RateLimit{Kbps: pc.MaxKbps + 1}); !errors.Is(err, unix.ERANGE) {
		t.Fatalf("rate above the range: %v, want ERANGE", err)
	}
	if err := p.SetRateLimit(1, qp.RateLimit{}); err != nil {
		t.Fatalf("remove the limit: %v", err)
	}
}

func TestHWDeviceMemory(t *testing.T) {
	p := openHW(t)
	if p.caps.DeviceMemory == 0 {
		t.Skip("the device has no on-device memory")
	}
	var released []int
	region, err := p.AllocDeviceMemory(4096, func(off int) { released = append(released, off) })
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n := testFrame(buf, p.mac, 1)
	if err := region.CopyTo(64, buf[:n]); err != nil {
		t.Fatal(err)
	}
	frame := []qp.Frame{region.TXFrame(64, n)}
	if k, err := p.TXBurst(frame); k != 1 || err != nil {
		t.Fatalf("post from device memory: %d, %v", k, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.TXPending() > 0 && time.Now().Before(deadline) {
		p.Complete()
	}
	if p.TXPending() > 0 || p.Stats().InvalidDescs != 0 || len(released) != 1 || released[0] != 64 {
		t.Fatalf("device-memory send did not complete cleanly: pending %d, released %v, stats %+v", p.TXPending(), released, p.Stats())
	}
	if _, err := p.AllocDeviceMemory(4096, func(int) {}); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("second region: %v, want EEXIST", err)
	}
}

func TestHWClock(t *testing.T) {
	p := openHW(t)
	clk, caps := p.Clock()
	if clk == nil {
		t.Skipf("the device clock cannot be read (caps %+v)", caps)
	}
	s1, err := clk.Sample()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	s2, err := clk.Sample()
	if err != nil {
		t.Fatal(err)
	}
	sys := float64((s2.SysBefore+s2.SysAfter)/2 - (s1.SysBefore+s1.SysAfter)/2)
	dev := float64(s2.HW - s1.HW)
	khz := p.caps.ClockKHz
	t.Logf("hca_core_clock %d kHz; 200 ms: device %.0f ns, system %.0f ns, brackets %d/%d ns", khz, dev, sys, s1.Width(), s2.Width())
	if dev < sys*0.99 || dev > sys*1.01 {
		t.Fatalf("device clock ran %.0f ns while the system clock ran %.0f: hca_core_clock (%d kHz) is not its rate", dev, sys, khz)
	}
	conv, err := tsconv.New(tsconv.ModeSync, clk, tsconv.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := conv.Update(time.Now()); err != nil {
		t.Fatal(err)
	}
	s3, err := clk.Sample()
	if err != nil {
		t.Fatal(err)
	}
	got, ok := conv.Convert(s3.HW)
	if d := got - (s3.SysBefore+s3.SysAfter)/2; !ok || d < -100_000 || d > 100_000 {
		t.Fatalf("converted device time is %d ns off the system clock (ok %v)", d, ok)
	}
}
