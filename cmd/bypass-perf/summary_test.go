package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sockperfSummary is what a script typically pulls out of sockperf's output.
type sockperfSummary struct {
	AvgKind         string // "latency" or "rtt"
	Avg, StdDev     float64
	Dropped         int
	Dup, OOO        int
	SummaryKind     string // "Latency" or "Round trip"
	SummaryUsec     float64
	Observations    int
	Max, Min        float64
	Percentiles     map[string]float64 // "99.999" ... "25.000"
	Sent, Received  uint64             // [Total Run]
	ValidSent       uint64             // [Valid Duration]
	ValidReceived   uint64             // [Valid Duration]
	StreamSent      uint64             // throughput: Total of N messages sent
	MsgRate         int                // throughput
	MBps, Mbps      float64            // throughput
	HasLatency      bool
	HasStream       bool
	NoReplies       bool
	NoObservations  bool
	ServerReceived  uint64 // server: Total N messages received and handled
	ServerNoneSeen  bool
	InterruptedUser bool
}

// Regular expressions in the style of the scripts that parse sockperf: they
// match the raw lines, colour escapes included.
var (
	reTotalRun   = regexp.MustCompile(`\[Total Run\] RunTime=([\d.]+) sec; Warm up time=(\d+) msec; SentMessages=(\d+); ReceivedMessages=(\d+)`)
	reValid      = regexp.MustCompile(`\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)`)
	reAvg        = regexp.MustCompile(`====> avg-(latency|rtt)=([\d.]+) \(std-dev=([\d.]+)\)`)
	reErrors     = regexp.MustCompile(`# dropped messages = (\d+); # duplicated messages = (\d+); # out-of-order messages = (\d+)`)
	reSummary    = regexp.MustCompile(`Summary: (Latency|Round trip) is ([\d.]+) usec`)
	reTotalObs   = regexp.MustCompile(`Total (\d+) observations.*; each percentile contains ([\d.]+) observations`)
	reMax        = regexp.MustCompile(`---> <MAX> observation = +([\d.]+)`)
	reMin        = regexp.MustCompile(`---> <MIN> observation = +([\d.]+)`)
	rePercentile = regexp.MustCompile(`---> percentile ([\d.]+) = +([\d.]+)`)
	reStreamSent = regexp.MustCompile(`Total of (\d+) messages sent in ([\d.]+) sec`)
	reMsgRate    = regexp.MustCompile(`Summary: Message Rate is (\d+) \[msg/sec\]`)
	reBandwidth  = regexp.MustCompile(`Summary: BandWidth is ([\d.]+) MBps \(([\d.]+) Mbps\)`)
	reServerRecv = regexp.MustCompile(`Total (\d+) messages received and handled`)
)

func parseSockperf(t testing.TB, out string) sockperfSummary {
	t.Helper()
	s := sockperfSummary{Percentiles: map[string]float64{}}
	f := func(v string) float64 {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("number %q in sockperf output: %v", v, err)
		}
		return x
	}
	u := func(v string) uint64 {
		x, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("number %q in sockperf output: %v", v, err)
		}
		return x
	}
	for _, line := range strings.Split(out, "\n") {
		if m := reTotalRun.FindStringSubmatch(line); m != nil {
			s.Sent, s.Received = u(m[3]), u(m[4])
		}
		if m := reValid.FindStringSubmatch(line); m != nil {
			s.ValidSent, s.ValidReceived = u(m[2]), u(m[3])
		}
		if m := reAvg.FindStringSubmatch(line); m != nil {
			s.HasLatency = true
			s.AvgKind, s.Avg, s.StdDev = m[1], f(m[2]), f(m[3])
		}
		if m := reErrors.FindStringSubmatch(line); m != nil {
			s.Dropped, s.Dup, s.OOO = int(u(m[1])), int(u(m[2])), int(u(m[3]))
		}
		if m := reSummary.FindStringSubmatch(line); m != nil {
			s.SummaryKind, s.SummaryUsec = m[1], f(m[2])
		}
		if m := reTotalObs.FindStringSubmatch(line); m != nil {
			s.Observations = int(u(m[1]))
		}
		if m := reMax.FindStringSubmatch(line); m != nil {
			s.Max = f(m[1])
		}
		if m := reMin.FindStringSubmatch(line); m != nil {
			s.Min = f(m[1])
		}
		if m := rePercentile.FindStringSubmatch(line); m != nil {
			s.Percentiles[m[1]] = f(m[2])
		}
		if m := reStreamSent.FindStringSubmatch(line); m != nil {
			s.HasStream = true
			s.StreamSent = u(m[1])
		}
		if m := reMsgRate.FindStringSubmatch(line); m != nil {
			s.MsgRate = int(u(m[1]))
		}
		if m := reBandwidth.FindStringSubmatch(line); m != nil {
			s.MBps, s.Mbps = f(m[1]), f(m[2])
		}
		if m := reServerRecv.FindStringSubmatch(line); m != nil {
			s.ServerReceived = u(m[1])
		}
		s.NoReplies = s.NoReplies || strings.Contains(line, noReplies)
		s.NoObservations = s.NoObservations || strings.Contains(line, "No valid observations found")
		s.ServerNoneSeen = s.ServerNoneSeen || strings.Contains(line, "No messages were received on the server.")
		s.InterruptedUser = s.InterruptedUser || strings.Contains(line, "Test end (interrupted by user)")
	}
	return s
}

var (
	reNumber = regexp.MustCompile(`\d+(\.\d+)?`)
	reSpaces = regexp.MustCompile(` +`)
)

// shapes reduces the lines of out from the first "Test end" line on to their
// shape: every number becomes '#' and runs of spaces (the %8.3f padding) one
// space. Lines sockperf prints that bypass-perf does not (warm-up notes) are
// not part of the summary.
func shapes(out string) []string {
	var res []string
	started := false
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.Contains(line, "Test end (") {
			started = true
		}
		if started {
			res = append(res, reSpaces.ReplaceAllString(reNumber.ReplaceAllString(line, "#"), " "))
		}
	}
	return res
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// syntheticRun is a ping-pong or under-load run of count reply requests every
// gap, each answered after rtt.
func syntheticRun(count int, every uint64, gap, rtt time.Duration) *latencyRun {
	run := &latencyRun{ReplyEvery: every}
	for i := range count {
		tx := int64(i) * int64(gap)
		run.TX = append(run.TX, tx)
		run.Replies = append(run.Replies, reply{Seq: uint64(i+1) * every, At: tx + int64(rtt) + int64(i%7)*100})
	}
	run.Sent = uint64(count) * every
	run.End = int64(count) * int64(gap)
	return run
}

// TestSummaryShapesMatchSockperf compares bypass-perf's summary lines with
// ones captured from the real sockperf 3.7 (testdata), line by line, numbers
// aside, and checks that a sockperf-style parser reads the same fields from
// both.
func TestSummaryShapesMatchSockperf(t *testing.T) {
	cases := []struct {
		file  string
		write func(p *printer)
	}{
		{"sockperf-3.7-ping-pong.txt", func(p *printer) {
			finish(p, new(atomic.Bool))
			writeLatencySummary(p, summarize(syntheticRun(2000, 1, 500*time.Microsecond, 14*time.Microsecond), false))
		}},
		{"sockperf-3.7-ping-pong-full-rtt.txt", func(p *printer) {
			finish(p, new(atomic.Bool))
			writeLatencySummary(p, summarize(syntheticRun(2000, 1, 500*time.Microsecond, 14*time.Microsecond), true))
		}},
		{"sockperf-3.7-under-load.txt", func(p *printer) {
			finish(p, new(atomic.Bool))
			writeLatencySummary(p, summarize(syntheticRun(100, 100, 10*time.Millisecond, 30*time.Microsecond), false))
		}},
		{"sockperf-3.7-throughput.txt", func(p *printer) {
			finish(p, new(atomic.Bool))
			writeStreamSummary(p, summarizeStream(196165, time.Second, 1400, 0))
		}},
		{"sockperf-3.7-throughput-mps.txt", func(p *printer) {
			finish(p, new(atomic.Bool))
			writeStreamSummary(p, summarizeStream(1001, time.Second, 3000, 1000))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			real := readTestdata(t, tc.file)
			var buf bytes.Buffer
			p := &printer{w: &buf, color: true}
			tc.write(p)
			if p.err != nil {
				t.Fatal(p.err)
			}
			ours := buf.String()
			want, got := shapes(real), shapes(ours)
			if strings.Join(want, "\n") != strings.Join(got, "\n") {
				t.Errorf("summary shape differs from sockperf's\nsockperf:\n%s\n\nbypass-perf:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
			}
			rs, ob := parseSockperf(t, real), parseSockperf(t, ours)
			if rs.HasLatency != ob.HasLatency || rs.HasStream != ob.HasStream || rs.AvgKind != ob.AvgKind ||
				rs.SummaryKind != ob.SummaryKind || len(rs.Percentiles) != len(ob.Percentiles) {
				t.Errorf("parsed fields differ:\nsockperf:    %+v\nbypass-perf: %+v", rs, ob)
			}
			for k := range rs.Percentiles {
				if _, ok := ob.Percentiles[k]; !ok {
					t.Errorf("percentile %s missing from bypass-perf's output", k)
				}
			}
		})
	}
}

func TestNoColor(t *testing.T) {
	var buf bytes.Buffer
	p := &printer{w: &buf}
	writeLatencySummary(p, summarize(syntheticRun(2000, 1, 500*time.Microsecond, 14*time.Microsecond), false))
	if strings.Contains(buf.String(), "\x1b") {
		t.Errorf("colour escapes without colour:\n%q", buf.String())
	}
	if s := parseSockperf(t, buf.String()); !s.HasLatency || s.Observations == 0 {
		t.Errorf("uncoloured summary does not parse: %+v", s)
	}
}

func TestPercentileIndex(t *testing.T) {
	cases := []struct {
		p    float64
		n    int
		want int
	}{
		{0.5, 1, 0},
		{0.25, 1, -1}, // int(0.75)-1: not printed
		{0.99999, 1, 0},
		{0.5, 2, 0},  // int(1.5)-1
		{0.75, 2, 1}, // int(2.0)-1
		{0.25, 2, 0}, // int(1.0)-1
		{0.99, 54, 52},
		{0.90, 54, 48},
		{0.75, 54, 40},
		{0.50, 54, 26},
		{0.25, 54, 13},
		{0.99999, 100000, 99998},
		{0.9999, 100000, 99989},
		{0.5, 100000, 49999},
	}
	for _, c := range cases {
		if got := percentileIndex(c.p, c.n); got != c.want {
			t.Errorf("percentileIndex(%v, %d) = %d, want %d", c.p, c.n, got, c.want)
		}
	}
}

// TestPercentileValues checks the printed percentiles against the rule over
// known samples (1..N µs one-way), and MIN/MAX.
func TestPercentileValues(t *testing.T) {
	for _, n := range []int{1, 2, 3, 54, 1000, 12345} {
		s := latencySummary{Valid: true, Received: uint64(n), AvgUsec: 1}
		for i := 1; i <= n; i++ {
			s.Observations = append(s.Observations, time.Duration(i)*time.Microsecond)
		}
		var buf bytes.Buffer
		writeLatencySummary(&printer{w: &buf}, s)
		got := parseSockperf(t, buf.String())
		if got.Observations != n || got.Max != float64(n) || got.Min != 1 {
			t.Errorf("n=%d: observations %d max %v min %v", n, got.Observations, got.Max, got.Min)
		}
		for _, p := range percentiles {
			key := fmt.Sprintf("%6.3f", 100*p)
			i := int(0.5+p*float64(n)) - 1
			v, ok := got.Percentiles[key]
			if i < 0 {
				if ok {
					t.Errorf("n=%d: percentile %s printed although its index is %d", n, key, i)
				}
				continue
			}
			if !ok || v != float64(i+1) {
				t.Errorf("n=%d: percentile %s = %v (printed %v), want %d", n, key, v, ok, i+1)
			}
		}
	}
}

func TestSummarizeCounts(t *testing.T) {
	const ms = int64(time.Millisecond)
	// 1000 requests 1 ms apart (valid window: tx in [400 ms, 949 ms]).
	run := &latencyRun{ReplyEvery: 1, Sent: 1000, End: 1000 * ms}
	for i := range 1000 {
		run.TX = append(run.TX, int64(i)*ms)
	}
	at := func(seq int) int64 { return run.TX[seq-1] + 20_000 } // 20 µs RTT
	for seq := 1; seq <= 1000; seq++ {
		switch seq {
		case 500, 501: // lost
		case 601: // arrives before 600's reply: out of order
			run.Replies = append(run.Replies, reply{Seq: 601, At: at(600) - 1})
		case 700: // duplicated
			run.Replies = append(run.Replies, reply{Seq: 700, At: at(700)}, reply{Seq: 700, At: at(700) + 5})
		default:
			run.Replies = append(run.Replies, reply{Seq: uint64(seq), At: at(seq)})
		}
	}
	run.Replies = append(run.Replies, reply{Seq: 5000, At: 1}) // never asked for
	s := summarize(run, false)
	if s.Received != 998 || s.Dropped != 2 || s.OutOfOrder != 1 || s.Duplicated != 1 || s.Unexpected != 1 {
		t.Errorf("received %d dropped %d ooo %d dup %d unexpected %d; want 998 2 1 1 1",
			s.Received, s.Dropped, s.OutOfOrder, s.Duplicated, s.Unexpected)
	}
	// Window: seq 401 (tx 400 ms) .. seq 950 (tx 949 ms) = 550 requests,
	// 2 lost and 1 out of order.
	if !s.Valid || len(s.Observations) != 547 || s.ValidSent != 550 {
		t.Errorf("valid %v observations %d valid sent %d; want 547, 550", s.Valid, len(s.Observations), s.ValidSent)
	}
	if s.AvgUsec != 10 || s.StdDevUsec != 0 {
		t.Errorf("avg %v std-dev %v; want 10 (one-way of 20 µs) and 0", s.AvgUsec, s.StdDevUsec)
	}
	if full := summarize(run, true); full.AvgUsec != 20 || full.Observations[0] != 20*time.Microsecond {
		t.Errorf("full RTT: avg %v first %v; want 20 µs", full.AvgUsec, full.Observations[0])
	}
}

func TestSummarizeShortRun(t *testing.T) {
	// Everything within 450 ms: nothing left once warm-up and cool-down
	// are cut, as in sockperf.
	s := summarize(syntheticRun(100, 1, time.Millisecond, 10*time.Microsecond), false)
	if s.Valid || s.Received != 100 {
		t.Fatalf("valid %v received %d", s.Valid, s.Received)
	}
	var buf bytes.Buffer
	writeLatencySummary(&printer{w: &buf}, s)
	if !parseSockperf(t, buf.String()).NoObservations {
		t.Errorf("want sockperf's no-valid-observations line:\n%s", buf.String())
	}
	buf.Reset()
	writeLatencySummary(&printer{w: &buf}, summarize(&latencyRun{ReplyEvery: 1, Sent: 10, TX: make([]int64, 10)}, false))
	if !parseSockperf(t, buf.String()).NoReplies {
		t.Errorf("want sockperf's no-replies line:\n%s", buf.String())
	}
}

func TestStdDev(t *testing.T) {
	d := []time.Duration{2, 4, 4, 4, 5, 5, 7, 9} // sample std-dev 2.138
	if got := stdDevNanos(d); got != 2 {
		t.Errorf("stdDevNanos = %d, want 2", got)
	}
	d = []time.Duration{1000, 3000}
	if got := stdDevNanos(d); got != 1414 {
		t.Errorf("stdDevNanos = %d, want 1414", got)
	}
	if got := stdDevNanos(d[:1]); got != 0 {
		t.Errorf("one sample: %d, want 0", got)
	}
}

func TestStreamSummary(t *testing.T) {
	// sockperf's own numbers (testdata/sockperf-3.7-throughput.txt):
	// 196165 messages of 1400 bytes in 1.000 s.
	s := summarizeStream(196165, time.Second, 1400, 0)
	if s.MsgPerS != 196165 {
		t.Errorf("message rate %d", s.MsgPerS)
	}
	var buf bytes.Buffer
	writeStreamSummary(&printer{w: &buf}, s)
	got := parseSockperf(t, buf.String())
	wantMB := float64(196165) * 1400 / (1 << 20)
	if got.MsgRate != 196165 || fmt.Sprintf("%.3f", got.MBps) != fmt.Sprintf("%.3f", wantMB) ||
		fmt.Sprintf("%.3f", got.Mbps) != fmt.Sprintf("%.3f", wantMB*8) {
		t.Errorf("parsed %+v, want rate 196165, %.3f MBps", got, wantMB)
	}
	if !strings.Contains(buf.String(), "Total of 196165 messages sent in 1.000 sec\n\n") {
		t.Errorf("missing sockperf's total line and the blank line after it:\n%s", buf.String())
	}
}
