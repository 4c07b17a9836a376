package ring_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// mqLab is a veth pair with queues queues on each end and a ring on every
// queue of A's end.
type mqLab struct {
	p     *netlab.Pair
	rings []*ring.Ring
}

func newMQLab(t *testing.T, queues int) *mqLab {
	t.Helper()
	p := netlab.NewPair(t, netlab.Options{RxQueues: queues, TxQueues: queues})
	l := &mqLab{p: p}
	for q := range queues {
		var r *ring.Ring
		err := p.A.NS.Do(func() error {
			var err error
			r, err = ring.Open(ring.Config{Interface: p.A.Name, Queue: q, Frames: 1024})
			return err
		})
		if err != nil {
			t.Fatalf("open ring on queue %d: %v", q, err)
		}
		l.rings = append(l.rings, r)
		t.Cleanup(func() {
			if err := r.Close(); err != nil {
				t.Errorf("close ring %d: %v", q, err)
			}
		})
	}
	return l
}

// TestEveryQueueNoLoss: 64 flows from distinct source ports, spread over 4
// veth queues by the peer's transmit queue choice, to endpoints homed on
// two of the four rings. Every datagram arrives, in order per flow, the
// rings hand frames of other rings' flows over, and no queue drops.
func TestEveryQueueNoLoss(t *testing.T) {
	t.Parallel()
	const queues, flows, rounds = 4, 64, 20
	l := newMQLab(t, queues)
	homes := []int{0, 2}
	var eps []*ring.Endpoint
	for _, q := range homes {
		ep, err := l.rings[q].BindUDP(netip.AddrPortFrom(l.p.A.Addr4(), 0))
		if err != nil {
			t.Fatalf("bind on ring %d: %v", q, err)
		}
		t.Cleanup(func() { _ = ep.Close() })
		eps = append(eps, ep)
	}
	dropsBefore := queueDrops(t, l.p.A)
	l.flows(t, eps, homes, flows, rounds)
	var handed, in, dropped uint64
	busy := 0
	for q, r := range l.rings {
		st := r.Stats()
		handed += st.RXHandedOff.Load()
		in += st.RXHandoffIn.Load()
		dropped += st.RXHandoffDropped.Load()
		if st.RXPackets.Load()+st.RXHandedOff.Load() > 0 {
			busy++
		}
		if (q == 1 || q == 3) && st.RXPackets.Load() != 0 {
			t.Errorf("ring %d has no endpoint but delivered %d datagrams", q, st.RXPackets.Load())
		}
	}
	if handed == 0 || handed != in || dropped != 0 {
		t.Errorf("handoff: %d handed over, %d taken in, %d dropped; want equal, non-zero and no drops\n%s", handed, in, dropped, mqState(l))
	}
	if busy < 3 {
		t.Errorf("only %d of %d rings received frames: the peer did not spread the flows\n%s", busy, queues, mqState(l))
	}
	var delivered uint64
	for _, q := range homes {
		delivered += l.rings[q].Stats().RXPackets.Load()
	}
	if delivered != flows*rounds {
		t.Errorf("home rings delivered %d datagrams, want %d", delivered, flows*rounds)
	}
	if d := queueDrops(t, l.p.A) - dropsBefore; d != 0 {
		t.Errorf("ethtool -S: %d frames dropped on A's queues", d)
	}
	prog := l.rings[0].Program()
	c, err := prog.Counters()
	if err != nil {
		t.Fatal(err)
	}
	t.Log(mqState(l))
	if c.OtherQueue != handed || c.NoQueueSocket != 0 {
		t.Errorf("program counters %+v: want OtherQueue = %d handed over, NoQueueSocket 0", c, handed)
	}
}

// flows sends rounds datagrams on each of n flows (kernel sockets in B
// with distinct source ports), flow i to eps[i % len(eps)], one round at a
// time so a loaded machine cannot overflow a ring, and checks that every
// datagram arrives in order per flow.
func (l *mqLab) flows(t *testing.T, eps []*ring.Endpoint, homes []int, n, rounds int) {
	t.Helper()
	senders := make([]*net.UDPConn, n)
	for i := range senders {
		senders[i] = l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	}
	next := make(map[netip.AddrPort]uint32) // per flow: the next sequence number expected
	buf := make([]byte, 2048)
	for round := range rounds {
		for i, s := range senders {
			var msg [64]byte
			binary.BigEndian.PutUint32(msg[:], uint32(round))
			if _, err := s.WriteToUDPAddrPort(msg[:], eps[i%len(eps)].LocalAddr()); err != nil {
				t.Fatalf("send: %v", err)
			}
		}
		for k, ep := range eps {
			for range n / len(eps) {
				got, from, err := ep.Recv(buf, time.Now().Add(5*time.Second))
				if err != nil {
					t.Fatalf("round %d, endpoint on ring %d: %v\n%s", round, homes[k], err, mqState(l))
				}
				if got != 64 {
					t.Fatalf("datagram of %d bytes from %v", got, from)
				}
				if seq := binary.BigEndian.Uint32(buf); seq != next[from] {
					t.Fatalf("flow %v: datagram %d, want %d (lost or reordered)", from, seq, next[from])
				}
				next[from]++
			}
		}
	}
	if len(next) != n {
		t.Fatalf("%d flows arrived, want %d", len(next), n)
	}
}

// TestQueueCountChange: the kernel refuses to take away a queue an AF_XDP
// socket is bound to (`ethtool -L` fails), so lowering the count while the
// rings run changes nothing and traffic keeps flowing on every queue.
func TestQueueCountChange(t *testing.T) {
	t.Parallel()
	l := newMQLab(t, 4)
	ep, err := l.rings[1].BindUDP(netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ep.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := l.p.A.NS.Command(ctx, "ethtool", "-L", l.p.A.Name, "rx", "2").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "AF_XDP") {
		t.Fatalf("ethtool -L rx 2 under the rings: %v %s; want the kernel's refusal", err, out)
	}
	for q, r := range l.rings {
		select {
		case <-r.Done():
			t.Fatalf("ring %d stopped: %v", q, r.Err())
		default:
		}
	}
	l.flows(t, []*ring.Endpoint{ep}, []int{1}, 16, 5)
}

func mqState(l *mqLab) string {
	var b strings.Builder
	for q, r := range l.rings {
		st := r.Stats()
		fmt.Fprintf(&b, "ring %d: rx %d, handed off %d, taken in %d, handoff dropped %d, no endpoint %d\n", q,
			st.RXPackets.Load(), st.RXHandedOff.Load(), st.RXHandoffIn.Load(), st.RXHandoffDropped.Load(), st.RXNoEndpoint.Load())
	}
	if c, err := l.rings[0].Program().Counters(); err == nil {
		fmt.Fprintf(&b, "program: %+v\n", c)
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
