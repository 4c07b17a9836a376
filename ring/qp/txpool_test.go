package qp

import "testing"

func TestTXPool(t *testing.T) {
	mem := make([]byte, 4*256)
	p := NewTXPool(mem, 256, 4)
	for _, off := range []uint64{0, 256, 512} {
		p.Put(off)
	}
	frames := make([]Frame, 2)
	if n := p.Take(frames); n != 2 || p.Len() != 1 {
		t.Fatalf("took %d, %d left", n, p.Len())
	}
	// Most recently freed first; Buf covers exactly its buffer.
	if frames[0].Handle != 512 || frames[1].Handle != 256 {
		t.Errorf("handles %d %d, want 512 256", frames[0].Handle, frames[1].Handle)
	}
	if len(frames[0].Buf) != 256 || cap(frames[0].Buf) != 256 || &frames[0].Buf[0] != &mem[512] {
		t.Errorf("buffer len %d cap %d", len(frames[0].Buf), cap(frames[0].Buf))
	}
	// Asking for more than is free takes what there is.
	more := make([]Frame, 3)
	if n := p.Take(more); n != 1 || more[0].Handle != 0 || p.Len() != 0 {
		t.Errorf("took %d (handle %d), %d left", n, more[0].Handle, p.Len())
	}
	if n := p.Take(more); n != 0 {
		t.Errorf("empty pool gave %d", n)
	}
}
