// Package tapfd is the ring provider of the TAP fallback path: a qp.Provider
// over a TAP device's descriptor. RXBurst reads the frames tc redirected to
// the device (one read(2) each), TXBurst writes frames that the device's
// ingress filter sends out of the NIC (one write(2) each, copied by the
// kernel before it returns, so sends complete at once).
//
// The device and its tc steering belong to the top-level package tap; this
// package moves frames, and its path opener (path.go, registered as "tap"
// with qp.Register) asks package tap for the device and steering of a ring. Receive timestamps: a TAP descriptor is not a
// socket and SO_TIMESTAMPING cannot be set on it (ENOTSOCK), so frames carry
// no hardware timestamp and the engine's software receive time is what the
// TAP path offers.
package tapfd

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
	tapdev "github.com/bypassd/bypassd/tap"
)

// Name is the provider's name in qp.Caps and ring.Config.Provider.
const Name = "tap"

// Config sizes the provider's buffers.
type Config struct {
	// FrameSize is the capacity of one buffer (default 2048).
	FrameSize int
	// Frames is the number of buffers, half for each direction (default
	// 1024).
	Frames int
}

// Provider moves frames through a TAP device. It owns the device and
// closes it with Close.
type Provider struct {
	dev       *tapdev.Device
	frameSize int
	bufs      []byte
	// rxFree and txFree are stacks of free buffer indices.
	rxFree, txFree []uint64
	rxFrames       int
	// err is the first unexpected descriptor error, reported by Wait.
	err     error
	pollFds [2]unix.PollFd
	closed  bool

	rxPackets, txPackets, rxBytes, txBytes atomic.Uint64
	fillEmpty, txNoBuffer, txErrors        atomic.Uint64
}

// New wraps dev; the provider owns it from now on (also when New fails).
func New(dev *tapdev.Device, cfg Config) (*Provider, error) {
	if cfg.FrameSize == 0 {
		cfg.FrameSize = 2048
	}
	if cfg.Frames == 0 {
		cfg.Frames = 1024
	}
	if cfg.FrameSize < 1024 || cfg.FrameSize > 65536 || cfg.Frames < 2 {
		_ = dev.Close()
		return nil, fmt.Errorf("tap %s: frame size %d (1024-65536) or frame count %d (>= 2) out of range", dev.Name(), cfg.FrameSize, cfg.Frames)
	}
	p := &Provider{dev: dev, frameSize: cfg.FrameSize, bufs: make([]byte, cfg.FrameSize*cfg.Frames), rxFrames: cfg.Frames / 2}
	for i := 0; i < cfg.Frames; i++ {
		if i < p.rxFrames {
			p.rxFree = append(p.rxFree, uint64(i))
		} else {
			p.txFree = append(p.txFree, uint64(i))
		}
	}
	p.pollFds[0] = unix.PollFd{Fd: int32(dev.FD()), Events: unix.POLLIN}
	return p, nil
}

func (p *Provider) buf(i uint64) []byte {
	off := int(i) * p.frameSize
	return p.bufs[off : off+p.frameSize : off+p.frameSize]
}

// Device returns the TAP device.
func (p *Provider) Device() *tapdev.Device { return p.dev }

// Caps implements qp.Provider.
func (p *Provider) Caps() qp.Caps {
	return qp.Caps{Provider: Name, Mode: "tap " + p.dev.Name(), FrameSize: p.frameSize, MaxFrame: p.frameSize,
		RXFrames: p.rxFrames, TXFrames: len(p.bufs)/p.frameSize - p.rxFrames}
}

// RXBurst implements qp.Provider.
func (p *Provider) RXBurst(frames []qp.Frame) int {
	n := 0
	var bytes uint64
	for n < len(frames) {
		if len(p.rxFree) == 0 {
			p.fillEmpty.Add(1)
			break
		}
		i := p.rxFree[len(p.rxFree)-1]
		b := p.buf(i)
		m, err := p.dev.Read(b)
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) && p.err == nil {
				p.err = fmt.Errorf("tap %s: read: %w", p.dev.Name(), err)
			}
			break
		}
		p.rxFree = p.rxFree[:len(p.rxFree)-1]
		frames[n] = qp.Frame{Buf: b[:m], Handle: i}
		bytes += uint64(m)
		n++
	}
	if n > 0 {
		p.rxPackets.Add(uint64(n))
		p.rxBytes.Add(bytes)
	}
	return n
}

// ReleaseRX implements qp.Provider.
func (p *Provider) ReleaseRX(frames []qp.Frame) {
	for _, f := range frames {
		p.rxFree = append(p.rxFree, f.Handle)
	}
}

// AllocTX implements qp.Provider.
func (p *Provider) AllocTX(frames []qp.Frame) int {
	n := min(len(frames), len(p.txFree))
	for k := 0; k < n; k++ {
		i := p.txFree[len(p.txFree)-1]
		p.txFree = p.txFree[:len(p.txFree)-1]
		frames[k] = qp.Frame{Buf: p.buf(i), Handle: i}
	}
	if n < len(frames) {
		p.txNoBuffer.Add(1)
	}
	return n
}

// FreeTX implements qp.Provider.
func (p *Provider) FreeTX(frames []qp.Frame) {
	for _, f := range frames {
		p.txFree = append(p.txFree, f.Handle)
	}
}

// TXBurst implements qp.Provider. A frame the kernel refuses as malformed
// is dropped and counted; a device that is down fails with ENETDOWN.
func (p *Provider) TXBurst(frames []qp.Frame) (int, error) {
	var bytes, sent uint64
	n := 0
	var err error
	for ; n < len(frames); n++ {
		f := frames[n]
		if werr := p.dev.Write(f.Buf); werr != nil {
			if errors.Is(werr, unix.EAGAIN) || errors.Is(werr, unix.ENOBUFS) {
				break // the caller posts the rest later
			}
			if errors.Is(werr, unix.EIO) || errors.Is(werr, unix.ENETDOWN) || errors.Is(werr, unix.EBADFD) {
				err = fmt.Errorf("tap %s: write: %w (the device is down)", p.dev.Name(), unix.ENETDOWN)
				break
			}
			p.txErrors.Add(1)
		} else {
			sent++
			bytes += uint64(len(f.Buf))
		}
		p.txFree = append(p.txFree, f.Handle)
	}
	p.txPackets.Add(sent)
	p.txBytes.Add(bytes)
	return n, err
}

// Complete implements qp.Provider: writes complete when they return.
func (p *Provider) Complete() int { return 0 }

// TXPending implements qp.Provider.
func (p *Provider) TXPending() int { return 0 }

// Wait implements qp.Provider.
func (p *Provider) Wait(timeout time.Duration, extra int) (bool, error) {
	if p.err != nil {
		return false, p.err
	}
	// ppoll, not poll: the engine sleeps until paced departures and
	// needs microseconds, not whole milliseconds (qp.Provider.Wait).
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	fds := p.pollFds[:1]
	if extra >= 0 {
		p.pollFds[1] = unix.PollFd{Fd: int32(extra), Events: unix.POLLIN}
		fds = p.pollFds[:2]
	}
	if _, err := unix.Ppoll(fds, ts, nil); err != nil && err != unix.EINTR {
		return false, fmt.Errorf("tap %s: poll: %w", p.dev.Name(), err)
	}
	if p.pollFds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
		return false, fmt.Errorf("tap %s: descriptor error (device removed?)", p.dev.Name())
	}
	return extra >= 0 && p.pollFds[1].Revents&unix.POLLIN != 0, nil
}

// FD implements qp.Provider: the TAP descriptor.
func (p *Provider) FD() int { return p.dev.FD() }

// Stats implements qp.Provider.
func (p *Provider) Stats() qp.Stats {
	return qp.Stats{RXPackets: p.rxPackets.Load(), TXPackets: p.txPackets.Load(),
		FillEmpty: p.fillEmpty.Load(), TXNoBuffer: p.txNoBuffer.Load(), InvalidDescs: p.txErrors.Load()}
}

// Bytes returns the bytes of frames received and sent through the TAP.
func (p *Provider) Bytes() (rx, tx uint64) { return p.rxBytes.Load(), p.txBytes.Load() }

// Close implements qp.Provider: it closes the device (the kernel removes
// it).
func (p *Provider) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	return p.dev.Close()
}
