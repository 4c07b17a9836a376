package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bypassd/bypassd/socket"
)

// One-way latency from receive timestamps. A client with --send-time puts
// its wall-clock send time (CLOCK_REALTIME ns, big-endian) in the first 8
// payload bytes after the sockperf header, just before each send; sockperf
// servers ignore the payload. A bypass-perf server with --one-way asks its
// socket for receive timestamps (SO_TIMESTAMPING) and reports, per request,
// the receive stamp minus that send time: the converted hardware stamp
// where the NIC gives one, else the software stamp the ring engine took.
// Both clocks must be the same or synchronised (one machine, or PTP).

// sendTimeOffset and minSendTimeSize place the send time in a message.
const (
	sendTimeOffset  = headerSize
	minSendTimeSize = headerSize + 8
)

// putSendTime writes now's wall-clock time into msg.
func putSendTime(msg []byte) {
	binary.BigEndian.PutUint64(msg[sendTimeOffset:], uint64(time.Now().UnixNano()))
}

// sendTime reads a client's send time; false when the message has none.
func sendTime(msg []byte) (int64, bool) {
	if len(msg) < minSendTimeSize {
		return 0, false
	}
	t := int64(binary.BigEndian.Uint64(msg[sendTimeOffset:]))
	return t, t > 0
}

// timestampConn is a socket that reports receive timestamps (the shim).
type timestampConn interface {
	SetTimestamping(flags int) error
}

// enableRXTimestamps turns on receive timestamps for --one-way.
func enableRXTimestamps(conn Conn) error {
	tc, ok := conn.(timestampConn)
	if !ok {
		return errors.New("--one-way needs receive timestamps from bypassd's sockets: run it without --kernel")
	}
	if err := tc.SetTimestamping(socket.TimestampAll); err != nil {
		return fmt.Errorf("enable receive timestamps (SO_TIMESTAMPING): %w", err)
	}
	return nil
}

// maxOneWaySamples bounds what a long-running server keeps (128 MiB).
const maxOneWaySamples = 1 << 24

// oneWayStats collects one-way latencies on the server.
type oneWayStats struct {
	samples  []time.Duration
	hardware uint64 // samples from hardware stamps
	missing  uint64 // requests with no send time or no receive stamp
	dropped  uint64 // samples beyond maxOneWaySamples
}

// add records one request: its bytes and its receive stamp.
func (s *oneWayStats) add(msg []byte, rx time.Time, hw bool) {
	sent, ok := sendTime(msg)
	if !ok || rx.IsZero() {
		s.missing++
		return
	}
	if len(s.samples) >= maxOneWaySamples {
		s.dropped++
		return
	}
	if hw {
		s.hardware++
	}
	s.samples = append(s.samples, time.Duration(rx.UnixNano()-sent))
}

// write prints the summary in sockperf's percentile style.
func (s *oneWayStats) write(p *printer) {
	if len(s.samples) == 0 {
		p.linef("one-way latency: no samples (%d requests without a send time or receive stamp: run the client with --send-time)", s.missing)
		return
	}
	d := slices.Clone(s.samples)
	slices.Sort(d)
	var sum float64
	for _, v := range d {
		sum += float64(v)
	}
	src := "software"
	if s.hardware == uint64(len(d)) {
		src = "hardware (converted to system time)"
	} else if s.hardware > 0 {
		src = fmt.Sprintf("hardware for %d, software for %d", s.hardware, uint64(len(d))-s.hardware)
	}
	p.linef("one-way latency (client send time -> %s receive stamp): %d samples, avg %.3f usec", src, len(d), sum/float64(len(d))/1e3)
	p.linef("---> <MAX> observation = %8.3f", usec(d[len(d)-1]))
	for _, pc := range percentiles {
		if i := percentileIndex(pc, len(d)); i >= 0 {
			p.linef("---> percentile %6.3f = %8.3f", pc*100, usec(d[i]))
		}
	}
	p.linef("---> <MIN> observation = %8.3f", usec(d[0]))
	if s.missing > 0 || s.dropped > 0 {
		p.linef("%d requests without a send time or receive stamp, %d beyond the %d kept samples", s.missing, s.dropped, maxOneWaySamples)
	}
}
