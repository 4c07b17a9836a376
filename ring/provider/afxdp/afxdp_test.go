package afxdp_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
)

func open(t *testing.T, l *netlab.Link, cfg afxdp.Config) (*afxdp.Socket, error) {
	t.Helper()
	cfg.Ifindex, cfg.IfName = l.Index, l.Name
	var s *afxdp.Socket
	err := l.NS.Do(func() error {
		var err error
		s, err = afxdp.Open(cfg)
		return err
	})
	if s != nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

// TestCopyFallback: veth has no zero-copy support, so the automatic mode
// binds in copy mode and says so.
func TestCopyFallback(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	s, err := open(t, p.A, afxdp.Config{XDPMode: "native"})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Caps()
	if c.ZeroCopy || c.Mode != "native/copy" || c.Provider != "afxdp" {
		t.Fatalf("caps %+v, want copy mode on veth", c)
	}
	if c.RXFrames+c.TXFrames != 4096 || c.FrameSize != 2048 {
		t.Fatalf("caps %+v, want 4096 frames of 2048 bytes", c)
	}
	if _, err := open(t, p.B, afxdp.Config{Copy: qp.ZeroCopyRequired}); !errors.Is(err, unix.EOPNOTSUPP) || !strings.Contains(err.Error(), "zero-copy") {
		t.Fatalf("zero-copy required on veth: %v, want EOPNOTSUPP explained", err)
	}
}

func TestBadQueueAndConfig(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	_, err := open(t, p.A, afxdp.Config{Queue: 3})
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "queue 3") || !strings.Contains(err.Error(), p.A.Name) {
		t.Fatalf("queue 3 on a one-queue veth: %v", err)
	}
	for _, cfg := range []afxdp.Config{{FrameSize: 3000}, {Frames: 100}, {RingSize: 48}, {Queue: -1}} {
		if _, err := open(t, p.A, cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

// TestBusyQueueAndReopen: a second socket on the same queue is refused with
// an explanation; after Close the queue can be bound again at once.
func TestBusyQueueAndReopen(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	s, err := open(t, p.A, afxdp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, p.A, afxdp.Config{BusyTimeout: 1}); !errors.Is(err, unix.EBUSY) || !strings.Contains(err.Error(), "another") {
		t.Fatalf("second socket on a busy queue: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		s, err := open(t, p.A, afxdp.Config{})
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTXBuffers: TX buffers are handed out, returned and posted; posting to
// a veth whose peer is up completes them.
func TestTXBuffers(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	s, err := open(t, p.A, afxdp.Config{Frames: 64})
	if err != nil {
		t.Fatal(err)
	}
	frames := make([]qp.Frame, 64)
	n := s.AllocTX(frames)
	if n != 32 {
		t.Fatalf("allocated %d TX frames of 32", n)
	}
	if s.AllocTX(frames[n:]) != 0 {
		t.Fatal("allocated beyond the TX pool")
	}
	s.FreeTX(frames[16:n])
	// Minimal broadcast frames: the kernel transmits what it is given.
	for i := 0; i < 16; i++ {
		b := frames[i].Buf[:60]
		copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(b[6:], p.A.MAC)
		b[12], b[13] = 0x88, 0xb5 // local experimental EtherType
		frames[i].Buf = b
	}
	posted, err := s.TXBurst(frames[:16])
	if err != nil || posted != 16 {
		t.Fatalf("posted %d: %v", posted, err)
	}
	done := 0
	for i := 0; i < 1000 && done < 16; i++ {
		done += s.Complete()
	}
	if done != 16 || s.TXPending() != 0 {
		t.Fatalf("completed %d of 16, pending %d", done, s.TXPending())
	}
	if st := s.Stats(); st.TXPackets != 16 || st.TXNoBuffer != 2 {
		t.Fatalf("stats %+v", st)
	}
	if got := s.AllocTX(frames); got != 32 {
		t.Fatalf("after completion %d frames free, want 32", got)
	}
}

// testFrame writes a minimal broadcast frame of n bytes from l into b.
func testFrame(b []byte, l *netlab.Link, seed byte) {
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:], l.MAC)
	b[12], b[13] = 0x88, 0xb5 // local experimental EtherType
	for i := 14; i < len(b); i++ {
		b[i] = seed + byte(i)
	}
}

// TestDeviceMemory: the reserved chunks are lent once, staged frames are
// sent from them, their completions go to the callback in order and never
// to the TX free list.
func TestDeviceMemory(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	s, err := open(t, p.A, afxdp.Config{Frames: 64, DeviceMemory: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Caps(); c.DeviceMemory != 5000 || c.TXFrames != 32 {
		t.Fatalf("caps %+v, want 5000 bytes of device memory and the TX pool unchanged", c)
	}
	var released []int
	cb := func(off int) { released = append(released, off) }
	if _, err := s.AllocDeviceMemory(5001, cb); err == nil || !strings.Contains(err.Error(), "5000 reserved") {
		t.Fatalf("asking more than reserved: %v", err)
	}
	if _, err := s.AllocDeviceMemory(4096, nil); err == nil {
		t.Fatal("region without a release callback accepted")
	}
	reg, err := s.AllocDeviceMemory(4096, cb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AllocDeviceMemory(64, cb); err == nil {
		t.Fatal("second region accepted")
	}
	if reg.Size() != 4096 {
		t.Fatalf("region size %d, want 4096", reg.Size())
	}
	if c, ok := reg.(interface{ ChunkSize() int }); !ok || c.ChunkSize() != 2048 {
		t.Fatal("region does not report the UMEM chunk size")
	}
	frames := make([]qp.Frame, 3)
	pkt := make([]byte, 1000)
	for i, off := range []int{0, 1000, 2048} {
		testFrame(pkt, p.A, byte(i))
		if err := reg.CopyTo(off, pkt); err != nil {
			t.Fatal(err)
		}
		frames[i] = reg.TXFrame(off, len(pkt))
		if got, ok := reg.Offset(frames[i]); !ok || got != off {
			t.Fatalf("Offset of the frame staged at %d: %d %v", off, got, ok)
		}
	}
	// FreeTX must not adopt a staged frame: the free list stays at 32.
	s.FreeTX(frames[:1])
	tx := make([]qp.Frame, 33)
	if n := s.AllocTX(tx); n != 32 {
		t.Fatalf("TX pool has %d frames after FreeTX of a staged one, want 32", n)
	}
	if _, ok := reg.Offset(tx[0]); ok {
		t.Fatal("a TX pool frame claims to be staged")
	}
	s.FreeTX(tx[:32])
	if n, err := s.TXBurst(frames); err != nil || n != 3 {
		t.Fatalf("posted %d staged frames: %v", n, err)
	}
	for i := 0; i < 1000 && len(released) < 3; i++ {
		s.Complete()
	}
	if len(released) != 3 || released[0] != 0 || released[1] != 1000 || released[2] != 2048 {
		t.Fatalf("released offsets %v, want [0 1000 2048] in posting order", released)
	}
	if n := s.AllocTX(tx); n != 32 {
		t.Fatalf("TX pool has %d frames after staged completions, want 32", n)
	}
	if st := s.Stats(); st.InvalidDescs != 0 {
		t.Fatalf("kernel refused %d staged descriptors", st.InvalidDescs)
	}
}

// TestChunkCrossingRefused pins the kernel behaviour the staging allocator
// is built around: in aligned-chunk mode a TX descriptor that crosses a
// chunk boundary is refused (tx_invalid_descs) and not sent, while one
// ending exactly at the boundary is sent. On this kernel the refused
// descriptor's address still comes back through the completion ring, in
// order, so the allocator gets its space back either way.
func TestChunkCrossingRefused(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	s, err := open(t, p.A, afxdp.Config{Frames: 64, DeviceMemory: 4096})
	if err != nil {
		t.Fatal(err)
	}
	const etherType = 0x88b5
	var sniff int
	if err := p.B.NS.Do(func() error {
		var err error
		sniff, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(etherType)))
		if err != nil {
			return err
		}
		return unix.Bind(sniff, &unix.SockaddrLinklayer{Protocol: htons(etherType), Ifindex: p.B.Index})
	}); err != nil {
		t.Fatalf("packet socket in %s: %v", p.B.NS.Name, err)
	}
	t.Cleanup(func() { _ = unix.Close(sniff) })
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(sniff, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}

	var released []int
	reg, err := s.AllocDeviceMemory(4096, func(off int) { released = append(released, off) })
	if err != nil {
		t.Fatal(err)
	}
	cross, fits := make([]byte, 100), make([]byte, 100)
	testFrame(cross, p.A, 1)
	testFrame(fits, p.A, 2)
	if err := reg.CopyTo(2000, cross); err != nil { // bytes 2000..2099 straddle 2048
		t.Fatal(err)
	}
	if err := reg.CopyTo(1948, fits); err != nil { // bytes 1948..2047 end at it
		t.Fatal(err)
	}
	if n, err := s.TXBurst([]qp.Frame{reg.TXFrame(2000, 100), reg.TXFrame(1948, 100)}); err != nil || n != 2 {
		t.Fatalf("posted %d: %v", n, err)
	}
	for i := 0; i < 1000 && len(released) < 2; i++ {
		s.Complete()
	}
	if len(released) != 2 || released[0] != 2000 || released[1] != 1948 {
		t.Fatalf("released %v, want [2000 1948] (completion order)", released)
	}
	if st := s.Stats(); st.InvalidDescs != 1 {
		t.Fatalf("invalid descriptors %d, want 1: did the kernel accept a chunk-crossing frame?", st.InvalidDescs)
	}
	buf := make([]byte, 2048)
	n, _, err := unix.Recvfrom(sniff, buf, 0)
	if err != nil {
		t.Fatalf("the frame ending at the chunk boundary did not arrive: %v", err)
	}
	if !bytes.Equal(buf[:n], fits) {
		t.Fatalf("received %d bytes that are not the frame ending at the boundary", n)
	}
	_ = unix.SetsockoptTimeval(sniff, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
	if n, _, err := unix.Recvfrom(sniff, buf, 0); err == nil {
		t.Fatalf("a second frame of %d bytes arrived: the chunk-crossing frame was sent", n)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
