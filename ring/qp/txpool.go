package qp

// TXPool is the free list of send buffers of a provider that owns its
// memory (an AF_XDP UMEM, a verbs memory region): fixed-size buffers named
// by their offset in that memory, handed out most recently freed first so
// the cache stays warm. It is the one piece of implementation this package
// holds, shared so that providers do not each keep a copy. Not safe for
// concurrent use (the engine thread owns its provider).
type TXPool struct {
	mem  []byte
	size uint64
	free []uint64
}

// NewTXPool returns an empty pool of frameSize-byte buffers in mem; Put
// fills it.
func NewTXPool(mem []byte, frameSize, capacity int) TXPool {
	return TXPool{mem: mem, size: uint64(frameSize), free: make([]uint64, 0, capacity)}
}

// Put returns the buffer at offset off.
func (p *TXPool) Put(off uint64) { p.free = append(p.free, off) }

// Len reports how many buffers are free.
func (p *TXPool) Len() int { return len(p.free) }

// Take fills frames with free buffers (Buf capped at the buffer size,
// Handle the offset) and returns how many it could.
func (p *TXPool) Take(frames []Frame) int {
	n := min(len(frames), len(p.free))
	for i := 0; i < n; i++ {
		off := p.free[len(p.free)-1-i]
		frames[i] = Frame{Buf: p.mem[off : off+p.size : off+p.size], Handle: off}
	}
	p.free = p.free[:len(p.free)-n]
	return n
}

// Offsets lists the free buffers' offsets (the pool's own slice: copy it
// to keep it).
func (p *TXPool) Offsets() []uint64 { return p.free }

// Reset makes offs the free buffers (a provider taking over another
// process's pool).
func (p *TXPool) Reset(offs []uint64) { p.free = append(p.free[:0], offs...) }
