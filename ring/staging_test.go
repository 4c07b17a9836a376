package ring_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/devmem"
)

// stagedPayload is datagram seq of n bytes: the sequence number, then a
// pattern derived from it, so a misplaced or corrupted byte is visible.
func stagedPayload(b []byte, seq uint64) {
	binary.BigEndian.PutUint64(b, seq)
	for i := 8; i < len(b); i++ {
		b[i] = byte(seq*31) + byte(i*7)
	}
}

// stagingRun sends n datagrams of sizes 64..1472 from a ring endpoint to a
// kernel receiver in the peer namespace, in bursts, at most window in flight (the
// receiver acknowledges through a channel, so its socket buffer never
// overflows), checks every one arrives byte-exact and in order, and
// returns how many of their frames were at or under the inline threshold
// and how many above. IPv4 over an MTU-1500 veth: no datagram is
// fragmented, and a frame is the payload plus 42 header bytes.
func stagingRun(t *testing.T, l *lab, n, window, inline int) (small, large uint64) {
	t.Helper()
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	recv := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	raw, err := recv.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	}); err != nil || serr != nil {
		t.Fatalf("SO_RCVBUFFORCE: %v %v", err, serr)
	}
	dst := recv.LocalAddr().(*net.UDPAddr).AddrPort()

	rng := rand.New(rand.NewPCG(uint64(n), uint64(window)))
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = 64 + rng.IntN(1472-64+1)
		if sizes[i]+42 <= inline {
			small++
		} else {
			large++
		}
	}
	tokens := make(chan struct{}, window)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 2048)
		want := make([]byte, 2048)
		for i := range sizes {
			_ = recv.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, _, err := recv.ReadFromUDPAddrPort(buf)
			if err != nil {
				done <- err
				return
			}
			w := want[:sizes[i]]
			stagedPayload(w, uint64(i))
			if !bytes.Equal(buf[:got], w) {
				done <- fmt.Errorf("datagram %d: got %d bytes starting with seq %d, want %d bytes byte-exact",
					i, got, binary.BigEndian.Uint64(buf), len(w))
				return
			}
			<-tokens
		}
		done <- nil
	}()
	// Bursts of 32 queued at once: the engine drains them together, so a
	// small region sees more large frames than it holds before any is
	// posted.
	const burst = 32
	buf := make([]byte, burst*1472)
	msgs := make([][]byte, 0, burst)
	for i := 0; i < n; i += len(msgs) {
		msgs = msgs[:0]
		for j := i; j < n && len(msgs) < burst; j++ {
			select {
			case tokens <- struct{}{}:
			case err := <-done:
				t.Fatalf("receiver stopped after fewer than %d datagrams: %v (ring %+v, staging %+v)", j, err, l.r.Stats(), l.r.DevMemStats())
			}
			m := buf[len(msgs)*1472:][:sizes[j]]
			stagedPayload(m, uint64(j))
			msgs = append(msgs, m)
		}
		if sent, err := ep.SendBatch(msgs, dst, time.Now().Add(10*time.Second)); err != nil || sent != len(msgs) {
			t.Fatalf("send %d..%d: %d queued, %v", i, i+len(msgs)-1, sent, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("receiver: %v (ring %+v, staging %+v)", err, l.r.Stats(), l.r.DevMemStats())
	}
	return small, large
}

// waitIdle waits until the staging region is empty again: every staged
// frame completed and was released.
func waitIdle(t *testing.T, r *ring.Ring) ring.DevMemStats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := r.DevMemStats()
		if s.InUse == 0 || time.Now().After(deadline) {
			return s
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStagingToKernel: with staging on, 100,000 datagrams of 64 to 1,472
// bytes arrive byte-exact at a kernel receiver, and the counters split
// exactly as the sizes predict: every frame over the inline threshold is
// staged, the rest are inline, none is oob (the region holds more than the
// flow-control window can have in flight: 128 frames of at most two chunks
// each, skip included, is 256 KiB of the 512 KiB region).
func TestStagingToKernel(t *testing.T) {
	l := newLab(t, ring.Config{DevMemTX: 512 << 10})
	if c := l.r.Caps(); c.DeviceMemory != 512<<10 {
		t.Fatalf("provider reserved %d bytes of device memory, want %d", c.DeviceMemory, 512<<10)
	}
	const n = 100000
	small, large := stagingRun(t, l, n, 128, devmem.DefaultInlineThreshold)
	s := waitIdle(t, l.r)
	t.Logf("%d datagrams: %d inline, %d staged (%d KiB), %d oob", n, s.InlinePackets, s.StagedPackets, s.StagedBytes/1024, s.OOBPackets)
	want := devmem.Stats{Capacity: 512 << 10, StagedPackets: large, StagedBytes: s.StagedBytes, InlinePackets: small}
	if s.Stats != want || s.ReleaseErrors != 0 {
		t.Fatalf("staging %+v, want %+v and no release errors", s, want)
	}
	if st := l.r.ProviderStats(); st.InvalidDescs != 0 {
		t.Fatalf("the kernel refused %d descriptors", st.InvalidDescs)
	}
	if got := l.r.Stats().TXPackets.Load(); got != n {
		t.Fatalf("ring sent %d datagrams, want %d", got, n)
	}
}

// TestStagingTinyRegion: a 4,032-byte region (two chunks) cannot hold a burst of
// large frames, so the excess goes from the TX buffers and is counted oob,
// with no loss; inline frames are never staged whatever the threshold is.
func TestStagingTinyRegion(t *testing.T) {
	const inline = 512
	l := newLab(t, ring.Config{DevMemTX: 4000, DevMemInline: inline})
	const n = 20000
	small, large := stagingRun(t, l, n, 1024, inline)
	s := waitIdle(t, l.r)
	t.Logf("%d datagrams: %d inline, %d staged, %d oob", n, s.InlinePackets, s.StagedPackets, s.OOBPackets)
	switch {
	case s.Capacity != 4032:
		t.Fatalf("granted %d bytes, want 4032 (4000 rounded up to 64)", s.Capacity)
	case s.InlinePackets != small:
		t.Fatalf("%d inline, want %d (frames of at most %d bytes)", s.InlinePackets, small, inline)
	case s.StagedPackets+s.OOBPackets != large:
		t.Fatalf("%d staged + %d oob, want %d frames over the threshold", s.StagedPackets, s.OOBPackets, large)
	case s.OOBPackets == 0 || s.StagedPackets == 0:
		t.Fatalf("staged %d, oob %d: want both paths used", s.StagedPackets, s.OOBPackets)
	case s.InUse != 0 || s.ReleaseErrors != 0:
		t.Fatalf("after the run %d bytes still staged, %d release errors", s.InUse, s.ReleaseErrors)
	}
}

// TestStagingOff: without DevMemTX nothing is staged or counted.
func TestStagingOff(t *testing.T) {
	l := newLab(t, ring.Config{})
	stagingRun(t, l, 2000, 128, devmem.DefaultInlineThreshold)
	if s := l.r.DevMemStats(); s != (ring.DevMemStats{}) {
		t.Fatalf("staging off but counted %+v", s)
	}
	if c := l.r.Caps(); c.DeviceMemory != 0 {
		t.Fatalf("provider reserved %d bytes of device memory unasked", c.DeviceMemory)
	}
}

// TestStagingOffWithFallback: with a TAP fallback the engine's provider
// switches paths at run time, so nothing is staged, whatever DevMemTX says
// (the grant shows 0), and traffic flows as without staging.
func TestStagingOffWithFallback(t *testing.T) {
	l := newLab(t, ring.Config{Fallback: ring.FallbackAuto, DevMemTX: 64 << 10})
	stagingRun(t, l, 2000, 128, devmem.DefaultInlineThreshold)
	if s := l.r.DevMemStats(); s != (ring.DevMemStats{}) {
		t.Fatalf("staged with a TAP fallback: %+v", s)
	}
}
