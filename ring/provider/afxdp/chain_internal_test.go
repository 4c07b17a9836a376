package afxdp

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
)

const (
	testChunk = 2048
	testRing  = 64
)

func fakeRingMem() ringMem {
	var prod, cons, flags uint32
	return ringMem{producer: &prod, consumer: &cons, flags: &flags, mask: testRing - 1, size: testRing}
}

// chainSocket is a multi-buffer Socket over in-memory rings: the test
// plays the kernel's side. Receive chains are bounded at maxSegs 3.
func chainSocket(t *testing.T) *Socket {
	t.Helper()
	s := &Socket{cfg: Config{FrameSize: testChunk, Frames: 64, MTU: 5000}, fd: -1, multi: true,
		umem: make([]byte, 64*testChunk)}
	s.rx = &descRing{ringMem: fakeRingMem(), descs: make([]unix.XDPDesc, testRing)}
	s.tx = &descRing{ringMem: fakeRingMem(), descs: make([]unix.XDPDesc, testRing)}
	s.fill = &addrRing{ringMem: fakeRingMem(), addrs: make([]uint64, testRing)}
	s.comp = &addrRing{ringMem: fakeRingMem(), addrs: make([]uint64, testRing)}
	s.rxFrames = 32
	s.stageBase = uint64(64 * testChunk)
	s.initPools()
	if s.rxLim.maxSegs != 3 {
		t.Fatalf("MTU 5000 at 2048-byte frames: receive chains of %d, want 3", s.rxLim.maxSegs)
	}
	return s
}

// produce plays the kernel: it fills chunk k's payload area with a byte
// pattern and posts descriptors (contd: XDP_PKT_CONTD).
func (s *Socket) produce(t *testing.T, chunk uint64, n uint32, contd bool) []byte {
	t.Helper()
	addr := chunk*testChunk + rxHeadroom
	data := s.umem[addr : addr+uint64(n)]
	for i := range data {
		data[i] = byte(chunk) + byte(i)
	}
	d := unix.XDPDesc{Addr: addr, Len: n}
	if contd {
		d.Options = unix.XDP_PKT_CONTD
	}
	p := *s.rx.producer
	s.rx.descs[p&s.rx.mask] = d
	*s.rx.producer = p + 1
	return data
}

func TestScanChain(t *testing.T) {
	lim := chainLimits{maxSegs: 3, umem: 8 * testChunk, chunk: testChunk}
	d := func(addr uint64, n uint32, contd bool) unix.XDPDesc {
		x := unix.XDPDesc{Addr: addr, Len: n}
		if contd {
			x.Options = unix.XDP_PKT_CONTD
		}
		return x
	}
	for _, tc := range []struct {
		name  string
		descs []unix.XDPDesc
		want  chainScan
	}{
		{"single", []unix.XDPDesc{d(256, 100, false)}, chainScan{state: chainOK, n: 1, length: 100, ended: true}},
		{"chain of 3", []unix.XDPDesc{d(256, 1792, true), d(2048+256, 1792, true), d(4096+256, 10, false)},
			chainScan{state: chainOK, n: 3, length: 3594, ended: true}},
		{"followed by another frame", []unix.XDPDesc{d(256, 1792, true), d(2048+256, 5, false), d(4096+256, 1, false)},
			chainScan{state: chainOK, n: 2, length: 1797, ended: true}},
		{"end not produced yet", []unix.XDPDesc{d(256, 1792, true), d(2048+256, 1792, true)}, chainScan{state: chainPartial}},
		{"nothing", nil, chainScan{state: chainPartial}},
		{"longer than the bound", []unix.XDPDesc{d(256, 1792, true), d(2048+256, 1792, true), d(4096+256, 1792, true), d(6144+256, 1, false)},
			chainScan{state: chainBad, n: 3}},
		{"crosses its chunk", []unix.XDPDesc{d(256, 1792, true), d(2048+1000, 1792, false)}, chainScan{state: chainBad, n: 2, ended: true}},
		{"outside the UMEM", []unix.XDPDesc{d(8*testChunk+256, 10, false)}, chainScan{state: chainBad, n: 1, ended: true}},
		{"address wraps", []unix.XDPDesc{d(^uint64(0)-5, 100, false)}, chainScan{state: chainBad, n: 1, ended: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ring := make([]unix.XDPDesc, 8)
			// Start near the end so that chains wrap around the ring.
			const cons = 6
			for i, x := range tc.descs {
				ring[(cons+i)&7] = x
			}
			if got := scanChain(ring, 7, cons, uint32(len(tc.descs)), lim); got != tc.want {
				t.Fatalf("scanChain = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestRXChains: whole chains come out linearized with every chunk refilled;
// a partial chain waits; an over-long chain is dropped, counted and skipped
// to its end across bursts, and the frames behind it still arrive.
func TestRXChains(t *testing.T) {
	s := chainSocket(t)
	frames := make([]qp.Frame, 8)

	// A chain whose end is not produced yet: nothing consumed.
	a := s.produce(t, 0, 1792, true)
	if n := s.RXBurst(frames); n != 0 || *s.rx.consumer != 0 {
		t.Fatalf("partial chain: %d frames, consumer %d", n, *s.rx.consumer)
	}
	b := s.produce(t, 1, 700, false)
	if n := s.RXBurst(frames); n != 1 {
		t.Fatalf("completed chain: %d frames", n)
	}
	if want := append(append([]byte{}, a...), b...); !bytes.Equal(frames[0].Buf, want) || frames[0].Handle != linearHandle {
		t.Fatalf("linearized frame: %d bytes, handle %#x", len(frames[0].Buf), frames[0].Handle)
	}
	if got := *s.fill.producer; got != 2 {
		t.Fatalf("fill ring got %d chunks back, want 2", got)
	}
	s.ReleaseRX(frames[:1]) // nothing more to refill
	if got := *s.fill.producer; got != 2 {
		t.Fatalf("ReleaseRX refilled a linearized frame's chunks again: fill %d", got)
	}

	// An endless chain: 3 descriptors this burst, 2 more (the last one
	// ending it) in the next, then an ordinary frame.
	for k := uint64(2); k < 5; k++ {
		s.produce(t, k, 1792, true)
	}
	if n := s.RXBurst(frames); n != 0 {
		t.Fatalf("over-long chain delivered %d frames", n)
	}
	s.produce(t, 5, 1792, true)
	s.produce(t, 6, 10, false)
	single := s.produce(t, 7, 60, false)
	n := s.RXBurst(frames)
	if n != 1 || !bytes.Equal(frames[0].Buf, single) {
		t.Fatalf("frame after the dropped chain: %d frames (%d bytes)", n, len(frames[0].Buf))
	}
	st := s.Stats()
	if st.RXBadChains != 1 || st.RXChains != 1 || st.RXPackets != 2 {
		t.Fatalf("stats %+v: want 1 bad chain, 1 chain, 2 frames", st)
	}
	if *s.rx.consumer != *s.rx.producer {
		t.Fatalf("descriptors left in the RX ring: consumer %d producer %d", *s.rx.consumer, *s.rx.producer)
	}
	// Every chunk but the single frame's (lent to the engine) is back.
	if got := *s.fill.producer; got != 7 {
		t.Fatalf("fill ring holds %d refilled chunks, want 7", got)
	}
	s.ReleaseRX(frames[:1])
	if got := *s.fill.producer; got != 8 {
		t.Fatalf("after ReleaseRX: %d refilled chunks, want 8", got)
	}
}

// TestTXChains: a frame larger than a chunk is posted as one descriptor
// per chunk of its slot, the slot coming back with its last completion.
func TestTXChains(t *testing.T) {
	s := chainSocket(t)
	frames := make([]qp.Frame, 2)
	if got := s.AllocTX(frames); got != 2 {
		t.Fatalf("AllocTX: %d", got)
	}
	if len(frames[0].Buf) < 5000+FrameOverhead {
		t.Fatalf("send buffer of %d bytes cannot hold an MTU-5000 frame", len(frames[0].Buf))
	}
	free := s.free.Len()
	frames[0].Buf = frames[0].Buf[:5018] // three chunks
	frames[1].Buf = frames[1].Buf[:60]   // one
	posted, _ := s.TXBurst(frames)       // the kick fails on the fake socket; the ring is what counts
	if posted != 2 || *s.tx.producer != 4 {
		t.Fatalf("posted %d frames in %d descriptors, want 2 in 4", posted, *s.tx.producer)
	}
	base := frames[0].Handle
	want := []unix.XDPDesc{
		{Addr: base, Len: testChunk, Options: unix.XDP_PKT_CONTD},
		{Addr: base + testChunk, Len: testChunk, Options: unix.XDP_PKT_CONTD},
		{Addr: base + 2*testChunk, Len: 5018 - 2*testChunk},
		{Addr: frames[1].Handle, Len: 60},
	}
	for i, w := range want {
		if s.tx.descs[i] != w {
			t.Fatalf("descriptor %d: %+v, want %+v", i, s.tx.descs[i], w)
		}
	}
	complete := func(addrs ...uint64) {
		for _, a := range addrs {
			p := *s.comp.producer
			s.comp.addrs[p&s.comp.mask] = a
			*s.comp.producer = p + 1
		}
		*s.tx.consumer = *s.tx.producer
		s.Complete()
	}
	complete(base, base+testChunk)
	if s.free.Len() != free {
		t.Fatalf("slot freed before its last chunk completed")
	}
	complete(base+2*testChunk, frames[1].Handle)
	if s.free.Len() != free+2 || s.TXPending() != 0 {
		t.Fatalf("after all completions: %d free (want %d), %d pending", s.free.Len(), free+2, s.TXPending())
	}
	if st := s.Stats(); st.TXChains != 1 || st.TXPackets != 2 {
		t.Fatalf("stats %+v: want 1 chain of 2 frames", st)
	}
}
