package daemon

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/internal/sockq"
)

func TestExpandInterfaces(t *testing.T) {
	counts := map[string]int{"eth1": 4, "eth2": 2}
	count := func(name string) (int, error) {
		if n, ok := counts[name]; ok {
			return n, nil
		}
		return 0, errors.New("no such interface")
	}
	for _, tc := range []struct {
		in    []config.Interface
		limit int
		want  []config.Interface
		err   string
	}{
		{in: []config.Interface{{Name: "eth1", Count: config.AllQueues}}, want: []config.Interface{{Name: "eth1", Queue: 0}, {Name: "eth1", Queue: 1}, {Name: "eth1", Queue: 2}, {Name: "eth1", Queue: 3}}},
		{in: []config.Interface{{Name: "eth1", Count: config.AllQueues}}, limit: 2, want: []config.Interface{{Name: "eth1", Queue: 0}, {Name: "eth1", Queue: 1}}},
		{in: []config.Interface{{Name: "eth1", Queue: 2, Count: config.AllQueues}}, want: []config.Interface{{Name: "eth1", Queue: 2}, {Name: "eth1", Queue: 3}}},
		{in: []config.Interface{{Name: "eth1", Queue: 1, Count: 2}, {Name: "eth2"}}, want: []config.Interface{{Name: "eth1", Queue: 1}, {Name: "eth1", Queue: 2}, {Name: "eth2", Queue: 0}}},
		{in: []config.Interface{{Name: "eth1", Count: config.AllQueues}, {Name: "eth1", Queue: 3}}, err: "queue 3 given twice"},
		{in: []config.Interface{{Name: "eth9", Count: config.AllQueues}}, err: "count its receive queues"},
		{in: []config.Interface{{Name: "eth2", Queue: 5, Count: config.AllQueues}}, err: "none from queue 5"},
	} {
		got, err := expandInterfaces(tc.in, tc.limit, count)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("expand %v: %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("expand %v (limit %d) = %v, %v; want %v", tc.in, tc.limit, got, err, tc.want)
		}
	}
}

func TestEngineCPUs(t *testing.T) {
	two := []config.Interface{{Name: "eth1"}, {Name: "eth1", Queue: 1}, {Name: "eth1", Queue: 2}}
	noBus := func(string) string { return "" }
	if got := engineCPUs(two, []int{5, 7}, noBus); !slices.EqualFunc(got, [][]int{{5}, {7}, {5}}, slices.Equal) {
		t.Errorf("with --cpus 5,7: %v, want rings on 5, 7, 5", got)
	}
	if got := engineCPUs(two[:1], nil, noBus); got[0] != nil {
		t.Errorf("a lone ring without --cpus is pinned to %v", got[0])
	}
	got := engineCPUs(two, nil, noBus)
	for k, set := range got {
		if len(set) == 0 {
			t.Errorf("ring %d not pinned without --cpus (spread expected): %v", k, got)
		}
	}
	irqs := map[int]string{30: "eth1-TxRx-0", 31: "i40e-eth1-TxRx-1", 40: "mlx5_comp2@pci:0000:03:00.0", 41: "eth10-TxRx-2"}
	for _, tc := range []struct {
		q    int
		bus  string
		want int
		ok   bool
	}{{0, "", 30, true}, {1, "", 31, true}, {2, "0000:03:00.0", 40, true}, {2, "", 0, false}, {3, "", 0, false}} {
		irq, ok := findQueueIRQ(irqs, "eth1", tc.q, tc.bus)
		if irq != tc.want || ok != tc.ok {
			t.Errorf("queue %d bus %q: irq %d %v, want %d %v", tc.q, tc.bus, irq, ok, tc.want, tc.ok)
		}
	}
}

// TestEveryQueue: on a 2- and a 4-queue interface the daemon, given the
// interface alone, opens a ring per queue, spreads sockets over them, and
// delivers every datagram of 64 flows from distinct source ports, in order
// per flow, whichever queue the peer's transmit queue choice put them on.
func TestEveryQueue(t *testing.T) {
	t.Parallel()
	for _, queues := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d queues", queues), func(t *testing.T) { everyQueue(t, queues) })
	}
}

func everyQueue(t *testing.T, queues int) {
	const sockets, flows, rounds = 8, 64, 10
	l := newLabQueues(t, config.Config{}, queues)
	if n := len(l.d.Rings()); n != queues {
		t.Fatalf("%d rings, want one per queue (%d)", n, queues)
	}
	c := helloClient(t, l)
	socks := make([]*clientSocket, sockets)
	locals := make([]netip.AddrPort, sockets)
	for i := range socks {
		s, err := c.open(unix.AF_INET, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		// Half bound to the wildcard: it works on a multi-ring interface.
		addr := netip.AddrPortFrom(l.p.A.Addr4(), 0)
		if i%2 == 1 {
			addr = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		}
		local, err := c.bind(s, addr, false)
		if err != nil {
			t.Fatalf("bind %v: %v", addr, err)
		}
		socks[i], locals[i] = s, netip.AddrPortFrom(l.p.A.Addr4(), local.Port())
	}
	for i, ri := range l.d.rings {
		if n := ri.homed.Load(); n != int64(sockets/queues) {
			t.Errorf("ring %d is home of %d sockets, want %d (spread by load)", i, n, sockets/queues)
		}
	}
	dropsBefore := queueDrops(t, l.p.A)
	senders := make([]*net.UDPConn, flows)
	for i := range senders {
		senders[i] = l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	}
	next := map[netip.AddrPort]uint32{}
	msgs := make([]sockq.Message, flows)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 2048)
	}
	for round := range rounds {
		for i, s := range senders {
			var msg [32]byte
			binary.BigEndian.PutUint32(msg[:], uint32(round))
			if _, err := s.WriteToUDPAddrPort(msg[:], locals[i%sockets]); err != nil {
				t.Fatal(err)
			}
		}
		// One round at a time: a loaded machine cannot overflow a ring,
		// so any loss is the steering's.
		for k, s := range socks {
			for got := 0; got < flows/sockets; {
				n, err := s.conn.RecvBatch(msgs[:flows/sockets-got], time.Now().Add(5*time.Second))
				if err != nil {
					t.Fatalf("round %d, socket %d: %v after %d datagrams\n%s", round, k, err, got, l.ringState())
				}
				for _, m := range msgs[:n] {
					if seq := binary.BigEndian.Uint32(m.Buf); seq != next[m.Addr] {
						t.Fatalf("flow %v: datagram %d, want %d (lost or reordered)", m.Addr, seq, next[m.Addr])
					}
					next[m.Addr]++
				}
				got += n
			}
		}
	}
	if len(next) != flows {
		t.Fatalf("%d flows arrived, want %d", len(next), flows)
	}
	var handed, in, dropped, rx uint64
	for i, r := range l.d.Rings() {
		st := r.Stats()
		handed += st.RXHandedOff.Load()
		in += st.RXHandoffIn.Load()
		dropped += st.RXHandoffDropped.Load()
		rx += st.RXPackets.Load()
		if st.RXPackets.Load() == 0 {
			t.Errorf("ring %d delivered nothing\n%s", i, l.ringState())
		}
	}
	if rx != flows*rounds || handed == 0 || handed != in || dropped != 0 {
		t.Errorf("delivered %d (want %d), handed over %d, taken in %d, dropped %d\n%s", rx, flows*rounds, handed, in, dropped, l.ringState())
	}
	if d := queueDrops(t, l.p.A) - dropsBefore; d != 0 {
		t.Errorf("ethtool -S: %d frames dropped on A's queues", d)
	}
	rdoc, err := l.d.queryRings(nil)
	if err != nil {
		t.Fatal(err)
	}
	var rHanded, rIn uint64
	for _, rd := range rdoc.(ctldoc.RingsDoc).Rings {
		rHanded, rIn = rHanded+rd.HandedOff, rIn+rd.HandoffIn
		if len(rd.CPUs) != 1 || rd.Sockets != sockets/queues {
			t.Errorf("rings topic, ring %d: CPUs %v, %d sockets; want one CPU (spread) and %d sockets", rd.Index, rd.CPUs, rd.Sockets, sockets/queues)
		}
	}
	if rHanded != handed || rIn != in {
		t.Errorf("rings topic: handoffs %d out, %d in; the rings counted %d, %d", rHanded, rIn, handed, in)
	}
	doc, err := l.d.queryDevices(nil)
	if err != nil {
		t.Fatal(err)
	}
	dev := doc.(ctldoc.DevicesDoc).Devices[0]
	if dev.RSS != "handoff" || dev.Ntuple || !strings.Contains(dev.NtupleNote, "ntuple on") || dev.RXQueues != queues || len(dev.Queues) != queues {
		t.Errorf("devices topic: %+v; want handoff, no n-tuple rules on veth, %d queues served", dev, queues)
	}
}

func (l *lab) ringState() string {
	var b strings.Builder
	for i, r := range l.d.Rings() {
		st := r.Stats()
		fmt.Fprintf(&b, "ring %d: rx %d, handed off %d, taken in %d, handoff dropped %d, no endpoint %d, endpoints %d\n", i,
			st.RXPackets.Load(), st.RXHandedOff.Load(), st.RXHandoffIn.Load(), st.RXHandoffDropped.Load(), st.RXNoEndpoint.Load(), r.Endpoints())
	}
	return b.String()
}

func queueDrops(t *testing.T, l *netlab.Link) uint64 {
	t.Helper()
	n, err := l.QueueDrops()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
