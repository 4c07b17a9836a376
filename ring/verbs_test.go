//go:build verbs

package ring

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/provider/verbs"
	"github.com/bypassd/bypassd/ring/qp"
)

// A verbs binary offers the provider, and a ring asked to use it on an
// interface without an RDMA device (a veth) fails saying so, leaving
// nothing behind.
func TestVerbsPathWithoutDevice(t *testing.T) {
	if !slices.Contains(qp.Providers(), "verbs") {
		t.Fatalf("providers %v: verbs not registered in a -tags verbs build", qp.Providers())
	}
	netlab.RequirePriv(t)
	pair := netlab.NewPair(t, netlab.Options{})
	err := pair.A.NS.Do(func() error {
		r, err := Open(Config{Interface: pair.A.Name, Provider: "verbs"})
		if err == nil {
			r.Close()
		}
		return err
	})
	if !errors.Is(err, verbs.ErrNoRDMADevice) {
		t.Fatalf("verbs ring on a veth: %v, want ErrNoRDMADevice", err)
	}
	t.Logf("as expected: %v", err)
}

// TestHWVerbsRingEcho is a hardware test (docs/hardware-testing.md): the
// whole ring on the verbs path, on the ConnectX interface BYPASSD_VERBS_IF,
// exchanging datagrams with the UDP echo server at BYPASSD_VERBS_ECHO
// (ip:port on another host, e.g. `socat UDP-LISTEN:7000,fork PIPE`). It
// skips without them; BYPASSD_REQUIRE_PRIV does not make it fail.
func TestHWVerbsRingEcho(t *testing.T) {
	ifname, echo := os.Getenv("BYPASSD_VERBS_IF"), os.Getenv("BYPASSD_VERBS_ECHO")
	if ifname == "" || echo == "" {
		t.Skip("hardware test: set BYPASSD_VERBS_IF=<ConnectX interface> and BYPASSD_VERBS_ECHO=<ip:port of a UDP echo server on another host> (docs/hardware-testing.md)")
	}
	peer, err := netip.ParseAddrPort(echo)
	if err != nil {
		t.Fatalf("BYPASSD_VERBS_ECHO: %v", err)
	}
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := ifc.Addrs()
	var local netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() == peer.Addr().Is4() && !ip.IsLinkLocalUnicast() {
				local = ip.Unmap()
				break
			}
		}
	}
	if !local.IsValid() {
		t.Fatalf("%s has no address of the echo server's family", ifname)
	}
	r, err := Open(Config{Interface: ifname, Provider: "verbs", HWTimestamps: tsconv.ModeSync})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	t.Logf("ring: %+v, timestamps %v", r.Caps(), r.HWTimestampMode())
	ep, err := r.BindUDP(netip.AddrPortFrom(local, 47123))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	buf := make([]byte, 2048)
	for i := 0; i < 100; i++ {
		msg := []byte("bypassd verbs echo " + time.Now().String())
		if err := ep.Send(msg, peer, time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		n, from, err := ep.Recv(buf, time.Now().Add(5*time.Second))
		if err != nil {
			flows, ferr := r.Flows()
			t.Fatalf("datagram %d: no echo from %v: %v (steered flows %v %v)", i, peer, err, flows, ferr)
		}
		if from != peer || string(buf[:n]) != string(msg) {
			t.Fatalf("datagram %d: %q from %v, want %q from %v", i, buf[:n], from, msg, peer)
		}
	}
	if st := r.Stats(); st.RXPackets.Load() < 100 || st.TXPackets.Load() < 100 {
		t.Fatalf("ring counted %d received, %d sent", st.RXPackets.Load(), st.TXPackets.Load())
	}
}
