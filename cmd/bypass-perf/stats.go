package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// sockperf (3.7, the Debian package) leaves the first 400 ms after the first
// reply request and the last 50 ms before the last one out of the latency
// statistics: the head runs without load and with cold caches, and replies to
// the tail may still be in flight when the test stops.
const (
	warmupWindow   = 400 * time.Millisecond
	cooldownWindow = 50 * time.Millisecond
)

// sockperf's summary colours: it prints them whatever stdout is, so scripts
// written against its output already cope with them.
const (
	colorMagenta = "\x1b[2;35m"
	colorRed     = "\x1b[0;31m"
	colorEnd     = "\x1b[0m"
)

// percentiles are the ones sockperf prints, highest first.
var percentiles = []float64{0.99999, 0.9999, 0.999, 0.99, 0.90, 0.75, 0.50, 0.25}

// latencyRun is what a ping-pong or under-load client collected. Times are
// nanoseconds on one monotonic clock.
type latencyRun struct {
	ReplyEvery uint64
	// Sent is the number of messages sent, which is also the last sequence
	// number (sequence numbers start at 1).
	Sent uint64
	// Start and End delimit the run (sockperf's s_startTime and s_endTime).
	Start, End int64
	// TX[k] is when the reply request with sequence (k+1)*ReplyEvery was
	// sent.
	TX []int64
	// Replies are the well-formed replies from the server, in arrival order.
	Replies []reply
}

// reply is one reply's sequence number and arrival time.
type reply struct {
	Seq uint64
	At  int64
}

// latencySummary is sockperf's client_statistics for one server.
type latencySummary struct {
	FullRTT  bool
	TotalRun time.Duration
	Sent     uint64
	Received uint64 // distinct replies

	// Valid is false when no observation fell inside the valid window
	// (the test was too short); the fields below are then zero.
	Valid        bool
	ValidRun     time.Duration
	ValidSent    uint64
	Dropped      uint64
	Duplicated   uint64
	OutOfOrder   uint64
	AvgUsec      float64
	StdDevUsec   float64
	Observations []time.Duration // sorted; one-way (RTT/2) unless FullRTT
	// Unexpected counts replies to sequence numbers that asked for none.
	Unexpected uint64
}

// summarize computes the statistics the way sockperf 3.7 does: walk the reply
// requests in sequence order inside the valid window, count a request without
// a reply as dropped and a reply that arrived before its predecessor's as
// out of order, and take RTT/2 (integer nanoseconds) as the one-way latency
// unless fullRTT.
func summarize(run *latencyRun, fullRTT bool) latencySummary {
	s := latencySummary{
		FullRTT:  fullRTT,
		TotalRun: time.Duration(run.End - run.Start),
		Sent:     run.Sent,
	}
	every := run.ReplyEvery
	if every == 0 {
		every = 1
	}
	rx := make([]int64, len(run.TX))
	for i := range rx {
		rx[i] = -1
	}
	for _, r := range run.Replies {
		if r.Seq == 0 || r.Seq%every != 0 || r.Seq/every > uint64(len(run.TX)) {
			// Not a sequence number this run asked a reply for.
			s.Unexpected++
			continue
		}
		k := r.Seq/every - 1
		if rx[k] >= 0 {
			s.Duplicated++
			continue
		}
		rx[k] = r.At
		s.Received++
	}
	if len(run.TX) == 0 || s.Received == 0 {
		return s
	}
	testStart := run.TX[0] + int64(warmupWindow)
	testEnd := run.TX[len(run.TX)-1] - int64(cooldownWindow)
	if testStart >= testEnd {
		return s
	}
	var (
		lat                  []time.Duration
		sumRTT               int64
		prevRX               int64 = -1
		startSeq, endSeq     uint64
		startTime, endTime   int64
		haveStart, haveEnd   bool
		denominator          int64 = 2
		dropped, outOfOrder  uint64
		maxObservations      = s.Received
		observationsGathered uint64
	)
	if fullRTT {
		denominator = 1
	}
	for k := 0; k < len(run.TX) && observationsGathered < maxObservations; k++ {
		seq := uint64(k+1) * every
		tx := run.TX[k]
		if tx > testEnd {
			break
		}
		if tx < testStart {
			continue
		}
		if !haveStart {
			haveStart, startSeq, startTime = true, seq, tx
		}
		if rx[k] < 0 {
			dropped++
			if !haveEnd || endTime < tx {
				haveEnd, endSeq, endTime = true, seq, tx
			}
			continue
		}
		if rx[k] < prevRX {
			outOfOrder++
			continue
		}
		haveEnd, endSeq, endTime = true, seq, rx[k]
		rtt := rx[k] - tx
		sumRTT += rtt
		lat = append(lat, time.Duration(rtt/denominator))
		prevRX = rx[k]
		observationsGathered++
	}
	s.Dropped, s.OutOfOrder = dropped, outOfOrder
	if len(lat) == 0 {
		return s
	}
	n := int64(len(lat))
	s.Valid = true
	s.ValidRun = time.Duration(endTime - startTime)
	s.ValidSent = endSeq - startSeq + 1
	avgRTT := sumRTT / n
	if fullRTT {
		s.AvgUsec = float64(avgRTT) / 1e3
	} else {
		s.AvgUsec = float64(avgRTT/2) / 1e3
	}
	s.StdDevUsec = float64(stdDevNanos(lat)) / 1e3
	slices.Sort(lat)
	s.Observations = lat
	return s
}

// stdDevNanos is the sample standard deviation rounded to whole nanoseconds,
// as sockperf computes it (0 for fewer than two samples).
func stdDevNanos(d []time.Duration) int64 {
	if len(d) <= 1 {
		return 0
	}
	var sum, sumSq float64
	for _, v := range d {
		f := float64(v)
		sum += f
		sumSq += f * f
	}
	n := float64(len(d))
	avg := sum / n
	variance := (sumSq - n*avg*avg) / (n - 1)
	if variance < 0 { // rounding on near-constant samples
		variance = 0
	}
	return int64(math.Sqrt(variance) + 0.5)
}

// percentileIndex is sockperf's rule: int(0.5 + p·N) − 1 over the sorted
// samples; a negative index means the percentile is not printed.
func percentileIndex(p float64, n int) int {
	return int(0.5+p*float64(n)) - 1
}

func usec(d time.Duration) float64 { return float64(d) / 1e3 }

// printer writes sockperf-style lines ("sockperf: ..."), with or without
// sockperf's colour escapes.
type printer struct {
	w     io.Writer
	color bool
	err   error
}

func (p *printer) linef(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, "sockperf: "+format+"\n", args...)
}

// raw writes s as it is (sockperf prints a few lines without its prefix).
func (p *printer) raw(s string) {
	if p.err != nil {
		return
	}
	_, p.err = io.WriteString(p.w, s)
}

// paint wraps s in a colour when colours are on.
func (p *printer) paint(color, s string) string {
	if !p.color {
		return s
	}
	return color + s + colorEnd
}

// writeLatencySummary prints what sockperf prints after a ping-pong or
// under-load run, line for line (sockperf 3.7's format).
func writeLatencySummary(p *printer, s latencySummary) {
	if s.Received == 0 {
		// sockperf prints this instead of everything else.
		p.linef("%s", noReplies)
		return
	}
	p.linef("[Total Run] RunTime=%.3f sec; Warm up time=%d msec; SentMessages=%d; ReceivedMessages=%d",
		s.TotalRun.Seconds(), warmupWindow.Milliseconds(), s.Sent, s.Received)
	p.linef("========= Printing statistics for Server No: 0")
	if !s.Valid {
		p.linef("No valid observations found. Try tune parameters: --time/--mps/--reply-every")
		return
	}
	p.linef("[Valid Duration] RunTime=%.3f sec; SentMessages=%d; ReceivedMessages=%d",
		s.ValidRun.Seconds(), s.ValidSent, len(s.Observations))
	kind, summaryKind := "latency", "Latency"
	if s.FullRTT {
		kind, summaryKind = "rtt", "Round trip"
	}
	p.linef("%s", p.paint(colorMagenta, fmt.Sprintf("====> avg-%s=%.3f (std-dev=%.3f)", kind, s.AvgUsec, s.StdDevUsec)))
	errs := fmt.Sprintf("# dropped messages = %d; # duplicated messages = %d; # out-of-order messages = %d",
		s.Dropped, s.Duplicated, s.OutOfOrder)
	if s.Dropped+s.Duplicated+s.OutOfOrder > 0 {
		errs = p.paint(colorRed, errs)
	}
	p.linef("%s", errs)
	if s.AvgUsec != 0 {
		p.linef("Summary: %s is %.3f usec", summaryKind, s.AvgUsec)
	}
	n := len(s.Observations)
	p.linef("%s; each percentile contains %.2f observations",
		p.paint(colorMagenta, fmt.Sprintf("Total %d observations", n)), float64(n)/100)
	p.linef("---> <MAX> observation = %8.3f", usec(s.Observations[n-1]))
	for _, pc := range percentiles {
		if i := percentileIndex(pc, n); i >= 0 {
			p.linef("---> percentile %6.3f = %8.3f", 100*pc, usec(s.Observations[i]))
		}
	}
	p.linef("---> <MIN> observation = %8.3f", usec(s.Observations[0]))
}

// noReplies is sockperf's line for a latency run without any reply.
const noReplies = "No messages were received from the server. Is the server down?"

// streamSummary is sockperf's stream_statistics (throughput mode): it reports
// only what was sent.
type streamSummary struct {
	Sent     uint64
	Run      time.Duration
	MsgSize  int
	MPS      int // 0: --mps max
	MsgPerS  int
	MBPerSec float64 // MiB/s of messages (headers below UDP not counted)
}

// ipPayload is the largest UDP payload of one unfragmented IPv4 packet at
// MTU 1500; sockperf reports fragments per message against it.
const ipPayload = 1500 - 28

func summarizeStream(sent uint64, run time.Duration, size, mps int) streamSummary {
	s := streamSummary{Sent: sent, Run: run, MsgSize: size, MPS: mps}
	if us := float64(run) / 1e3; us > 0 {
		s.MsgPerS = int(0.5 + float64(sent)*1e6/us)
	}
	s.MBPerSec = float64(s.MsgPerS) * float64(size) / 1024 / 1024
	return s
}

// writeStreamSummary prints what sockperf prints after a throughput run.
func writeStreamSummary(p *printer, s streamSummary) {
	// sockperf's format ends in "\n", so an empty line follows.
	p.linef("Total of %d messages sent in %.3f sec\n", s.Sent, s.Run.Seconds())
	switch {
	case s.MPS != 0:
		p.linef("%s", p.paint(colorMagenta, fmt.Sprintf("NOTE: test was performed, using msg-size=%d, mps=%d. "+
			"For getting maximum throughput use --mps=max (and consider --msg-size=1472 or --msg-size=4096)", s.MsgSize, s.MPS)))
	case s.MsgSize != ipPayload:
		p.linef("%s", p.paint(colorMagenta, fmt.Sprintf("NOTE: test was performed, using msg-size=%d. "+
			"For getting maximum throughput consider using --msg-size=%d", s.MsgSize, ipPayload)))
	}
	frags := (s.MsgSize + ipPayload - 1) / ipPayload
	if frags == 1 {
		p.linef("Summary: Message Rate is %d [msg/sec]", s.MsgPerS)
	} else {
		p.linef("Summary: Message Rate is %d [msg/sec], Packet Rate is about %d [pkt/sec] (%d ip frags / msg)",
			s.MsgPerS, s.MsgPerS*frags, frags)
	}
	p.linef("Summary: BandWidth is %.3f MBps (%.3f Mbps)", s.MBPerSec, s.MBPerSec*8)
}
