package ring

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/wire/packet"
)

func TestInboxFIFOAndFull(t *testing.T) {
	ib := newInbox(4, 64)
	if ib.pending() {
		t.Fatal("new inbox has a frame")
	}
	for i := range 4 {
		if !ib.push([]byte{byte(i), 1, 2}, uint64(i)) {
			t.Fatalf("push %d refused", i)
		}
	}
	if ib.push([]byte{9}, 0) {
		t.Fatal("push into a full inbox accepted")
	}
	if ib.push(make([]byte, 65), 0) {
		t.Fatal("frame larger than a slot accepted")
	}
	for i := range 4 {
		f, ts, ok := ib.peek()
		if !ok || len(f) != 3 || f[0] != byte(i) || ts != uint64(i) {
			t.Fatalf("frame %d: %v %d %v", i, f, ts, ok)
		}
		ib.pop()
	}
	if _, _, ok := ib.peek(); ok || ib.pending() {
		t.Fatal("drained inbox still has a frame")
	}
	// Wrapped around: the slots are reusable.
	if !ib.push([]byte{7}, 0) || !ib.pending() {
		t.Fatal("push after wrap-around refused")
	}
}

// TestInboxProducers: several producers at once (the receiving rings), one
// consumer (the home engine): every frame arrives once, each producer's in
// its order, and a full inbox only refuses, never corrupts.
func TestInboxProducers(t *testing.T) {
	const producers, each = 4, 5000
	ib := newInbox(64, 16)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [8]byte
			for i := 0; i < each; {
				binary.LittleEndian.PutUint32(b[:], uint32(p))
				binary.LittleEndian.PutUint32(b[4:], uint32(i))
				if ib.push(b[:], 0) {
					i++
				}
			}
		}()
	}
	next := make([]uint32, producers)
	for got := 0; got < producers*each; {
		f, _, ok := ib.peek()
		if !ok {
			continue
		}
		p, i := binary.LittleEndian.Uint32(f), binary.LittleEndian.Uint32(f[4:])
		if int(p) >= producers || i != next[p] {
			t.Fatalf("producer %d: frame %d, want %d", p, i, next[p])
		}
		next[p]++
		ib.pop()
		got++
	}
	wg.Wait()
}

// BenchmarkInbox is the handoff's own cost per frame: a push by the
// receiving engine and a peek and pop by the home engine, 64-byte frames
// (the copy into the home ring's endpoint queue is the same as without a
// handoff).
func BenchmarkInbox(b *testing.B) {
	ib := newInbox(handoffSlots, 2048)
	frame := make([]byte, 64+42)
	for range b.N {
		ib.push(frame, 0)
		if _, _, ok := ib.peek(); ok {
			ib.pop()
		}
	}
}

// TestStaleTagNeverMisdelivers: a frame handed to a ring that does not own
// its flow (a stale or forged tag: the flow moved, or its endpoint closed)
// is dropped there as having no endpoint; the datagram never reaches a
// socket of another ring, and the same frame handed to the right ring is
// delivered.
func TestStaleTagNeverMisdelivers(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{RxQueues: 2, TxQueues: 2})
	rings := make([]*Ring, 2)
	for q := range rings {
		err := p.A.NS.Do(func() error {
			var err error
			rings[q], err = Open(Config{Interface: p.A.Name, Queue: q, Frames: 256})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rings[q].Close() })
	}
	ep, err := rings[0].BindUDP(netip.AddrPortFrom(p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	tmpl, err := packet.NewTemplate(p.B.MAC, p.A.MAC, netip.AddrPortFrom(p.B.Addr4(), 4000), ep.LocalAddr(), 1500, packet.TemplateOptions{TTL: 64})
	if err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, 2048)
	n, err := tmpl.BuildFrame(frame, []byte("tagged"), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	handIn := func(r *Ring) {
		t.Helper()
		before := r.stats.RXHandoffIn.Load()
		if !r.inbox.push(frame[:n], 0) {
			t.Fatal("inbox full")
		}
		r.doorbell.Wake()
		for deadline := time.Now().Add(5 * time.Second); r.stats.RXHandoffIn.Load() == before; {
			if time.Now().After(deadline) {
				t.Fatal("the engine did not take the handed frame")
			}
			time.Sleep(time.Millisecond)
		}
	}
	handIn(rings[1])
	if got := rings[1].stats.RXNoEndpoint.Load(); got != 1 {
		t.Errorf("wrong ring: RXNoEndpoint %d, want 1", got)
	}
	buf := make([]byte, 64)
	if _, _, err := ep.Recv(buf, time.Now().Add(100*time.Millisecond)); err == nil {
		t.Fatal("a frame handed to the wrong ring reached the endpoint")
	}
	handIn(rings[0])
	if m, _, err := ep.Recv(buf, time.Now().Add(5*time.Second)); err != nil || string(buf[:m]) != "tagged" {
		t.Fatalf("the home ring did not deliver the frame: %q %v", buf[:m], err)
	}
}
