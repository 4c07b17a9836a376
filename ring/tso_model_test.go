package ring_test

import (
	"sync/atomic"

	"github.com/bypassd/bypassd/internal/tsomodel"
	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
)

// segmentingName is the provider of the lab's hardware TSO path: AF_XDP
// behind a model of a NIC that segments large TCP packets (segmentingQP).
const segmentingName = "afxdp+tso-model"

func init() {
	qp.Register(segmentingName, func(pc qp.PathConfig) (qp.Provider, qp.Steering, error) {
		p, s, err := qp.Open(afxdp.Name, pc)
		if err != nil {
			return nil, nil, err
		}
		sq := &segmentingQP{Provider: p}
		for i := range 8 {
			sq.bufs = append(sq.bufs, make([]byte, 68<<10))
			sq.free = append(sq.free, i)
		}
		return sq, s, nil
	})
}

// segmentingQP is a qp.Segmenter as the verbs provider is one on a
// ConnectX: the engine hands it whole large TCP packets, and it cuts them
// into the AF_XDP provider's frames the way a NIC does (internal/tsomodel),
// so the engine's hardware TSO path runs end to end against a kernel peer.
// Its large buffers are done as soon as they are cut.
type segmentingQP struct {
	qp.Provider
	bufs  [][]byte
	free  []int
	segs  []qp.Frame
	large atomic.Uint64
}

// largeTag marks the handles of large buffers (index below it).
const largeTag = 1 << 62

func (s *segmentingQP) AllocTSO(f *qp.Frame, size, hdr int) bool {
	if len(s.free) == 0 || size > len(s.bufs[0]) {
		return false
	}
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	*f = qp.Frame{Buf: s.bufs[i], Handle: largeTag | uint64(i)}
	return true
}

func (s *segmentingQP) FreeTX(frames []qp.Frame) {
	for i := range frames {
		if frames[i].Handle&largeTag != 0 {
			s.free = append(s.free, int(frames[i].Handle&^largeTag))
		} else {
			s.Provider.FreeTX(frames[i : i+1])
		}
	}
}

// TXBurst posts runs of ordinary frames as they are and cuts each large
// one into frames; like a device with a full queue, it stops where the
// AF_XDP provider has no room.
func (s *segmentingQP) TXBurst(frames []qp.Frame) (int, error) {
	done := 0
	for done < len(frames) {
		end := done
		for end < len(frames) && frames[end].MSS == 0 {
			end++
		}
		if end > done {
			n, err := s.Provider.TXBurst(frames[done:end])
			done += n
			if err != nil || done < end {
				return done, err
			}
			continue
		}
		if ok, err := s.cut(frames[done]); !ok || err != nil {
			return done, err
		}
		s.FreeTX(frames[done : done+1])
		done++
	}
	return done, nil
}

// cut sends one large frame as its segments; false when there were not
// send buffers for all of them (nothing sent, try again later).
func (s *segmentingQP) cut(f qp.Frame) (bool, error) {
	ip, hdr, mss := f.Buf[14:], int(f.HeaderLen)-14, int(f.MSS)
	k := tsomodel.Segments(len(ip), hdr, mss)
	s.segs = append(s.segs[:0], make([]qp.Frame, k)...)
	if got := s.Provider.AllocTX(s.segs); got < k {
		s.Provider.FreeTX(s.segs[:got])
		return false, nil
	}
	for i := range s.segs {
		b := s.segs[i].Buf
		copy(b, f.Buf[:14])
		s.segs[i].Buf = b[:14+tsomodel.Segment(b[14:], ip, hdr, mss, i)]
	}
	n, err := s.Provider.TXBurst(s.segs)
	// What the queue did not take is lost, as on a wire; TCP sends it again.
	s.Provider.FreeTX(s.segs[n:])
	s.large.Add(1)
	return true, err
}

func (s *segmentingQP) Stats() qp.Stats {
	st := s.Provider.Stats()
	st.TXTSOPackets = s.large.Load()
	return st
}
