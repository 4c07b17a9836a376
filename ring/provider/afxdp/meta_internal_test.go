package afxdp

import (
	"encoding/binary"
	"testing"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/qp"
)

// metaSocket is a Socket with only what readMeta touches: the UMEM and
// the frame size.
func metaSocket() *Socket {
	return &Socket{cfg: Config{FrameSize: 2048, RXMetadata: true}, umem: make([]byte, 8*2048)}
}

func putMeta(umem []byte, addr uint64, ts uint64, status int32) {
	m := umem[addr-bpf.RXMetaSize : addr]
	binary.LittleEndian.PutUint64(m, ts)
	binary.LittleEndian.PutUint32(m[8:], uint32(status))
	binary.LittleEndian.PutUint32(m[12:], bpf.RXMetaMagic)
}

func TestReadMeta(t *testing.T) {
	s := metaSocket()
	const headroom = 256
	frames := []qp.Frame{
		{Handle: 0*2048 + headroom}, // stamped
		{Handle: 1*2048 + headroom}, // metadata, no stamp (veth: status 0, ts 0)
		{Handle: 2*2048 + headroom}, // metadata, -ENODATA
		{Handle: 3*2048 + headroom}, // no metadata
		{Handle: 4*2048 + 8},        // no room in front within the chunk
	}
	putMeta(s.umem, frames[0].Handle, 1_700_000_000_123_456_789, 0)
	putMeta(s.umem, frames[1].Handle, 0, 0)
	putMeta(s.umem, frames[2].Handle, 0, -61)
	s.readMeta(frames)
	want := []uint64{1_700_000_000_123_456_789, 0, 0, 0, 0}
	for i, f := range frames {
		if f.HWTimestamp != want[i] {
			t.Errorf("frame %d: HWTimestamp %d, want %d", i, f.HWTimestamp, want[i])
		}
	}
	if m, st := s.RXMetadataStats(); m != 3 || st != 1 {
		t.Fatalf("metadata stats %d/%d, want 3 frames with metadata, 1 stamped", m, st)
	}
	// The magic was cleared: the buffers' next frames, if the program
	// writes nothing for them, carry no stale stamp.
	for i := range frames {
		frames[i].HWTimestamp = 0
	}
	s.readMeta(frames)
	for i, f := range frames {
		if f.HWTimestamp != 0 {
			t.Errorf("frame %d: stale stamp %d on reuse", i, f.HWTimestamp)
		}
	}
	if m, _ := s.RXMetadataStats(); m != 3 {
		t.Fatalf("metadata counted again on reuse: %d", m)
	}
}

// BenchmarkReadMeta is the provider's per-frame cost of hardware
// timestamps: parse and clear the metadata in front of the frames, in
// bursts of 64 (ns/op is per frame).
func BenchmarkReadMeta(b *testing.B) {
	const n = 1024 // frames per untimed refill: the timer is stopped rarely
	s := metaSocket()
	s.umem = make([]byte, n*2048)
	frames := make([]qp.Frame, n)
	for i := range frames {
		frames[i].Handle = uint64(i*2048 + 256)
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += n {
		// What the program writes is not the provider's cost.
		b.StopTimer()
		for i := range frames {
			putMeta(s.umem, frames[i].Handle, 1_700_000_000_000_000_000, 0)
		}
		b.StartTimer()
		for i := 0; i < n; i += 64 {
			s.readMeta(frames[i : i+64])
		}
	}
}

func putTag(umem []byte, at uint64, home uint32) {
	m := umem[at-bpf.FlowMetaSize : at]
	binary.LittleEndian.PutUint32(m[0:], home)
	binary.LittleEndian.PutUint32(m[4:], bpf.FlowMetaMagic)
}

// TestReadFlowTags: the tag sits right before the frame with the plain
// program and before RXMeta with the timestamping one; it is cleared once
// read, so a reused buffer never carries a stale home.
func TestReadFlowTags(t *testing.T) {
	const headroom = 256
	for _, ts := range []bool{false, true} {
		s := metaSocket()
		s.cfg.RXMetadata = ts
		frames := []qp.Frame{
			{Handle: 0*2048 + headroom}, // tagged home 3
			{Handle: 1*2048 + headroom}, // tagged home 0
			{Handle: 2*2048 + headroom}, // untagged
			{Handle: 3*2048 + 4},        // no room in front within the chunk
		}
		at := func(f qp.Frame) uint64 {
			if ts {
				putMeta(s.umem, f.Handle, 0, 0)
				return f.Handle - bpf.RXMetaSize
			}
			return f.Handle
		}
		putTag(s.umem, at(frames[0]), 3)
		putTag(s.umem, at(frames[1]), 0)
		s.readMeta(frames)
		want := []struct {
			tagged bool
			home   uint32
		}{{true, 3}, {true, 0}, {false, 0}, {false, 0}}
		for i, f := range frames {
			if f.Tagged != want[i].tagged || f.Home != want[i].home {
				t.Errorf("timestamps %v, frame %d: tagged %v home %d, want %v %d", ts, i, f.Tagged, f.Home, want[i].tagged, want[i].home)
			}
		}
		for i := range frames {
			frames[i].Tagged, frames[i].Home = false, 0
		}
		s.readMeta(frames)
		for i, f := range frames {
			if f.Tagged {
				t.Errorf("timestamps %v, frame %d: stale tag %d on reuse", ts, i, f.Home)
			}
		}
	}
}
