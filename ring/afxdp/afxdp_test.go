package afxdp_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/afxdp"
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
	if _, err := open(t, p.B, afxdp.Config{Copy: afxdp.ZeroCopyRequired}); !errors.Is(err, unix.EOPNOTSUPP) || !strings.Contains(err.Error(), "zero-copy") {
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
