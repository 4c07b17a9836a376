package daemon

import (
	"encoding/binary"
	"fmt"
	"math"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/stats"
)

// Packet pacing on the daemon's side: one rate table per interface, shared
// by that interface's rings (the rate table is a device resource), and the
// SO_MAX_PACING_RATE option of each socket holding a reference on one of
// its entries. The engine (package ring) enforces the rate.

// openRateTables gives every ring its interface's rate table. The range
// comes from the device when its provider paces in hardware, else from
// the configuration.
func (d *Daemon) openRateTables() {
	tables := map[string]*pacing.Table{}
	for _, ri := range d.rings {
		t := tables[ri.it.Name]
		if t == nil {
			tc := d.cfg.Pacing
			tc.Device = ri.it.Name
			if hw := ri.ring().Caps().RateLimit; hw != nil {
				tc.MinKbps, tc.MaxKbps = hw.MinKbps, hw.MaxKbps
			}
			t = pacing.NewTable(tc)
			tables[ri.it.Name] = t
			c := t.Config()
			ri.log.Info("rate table", zap.Int("entries", c.Capacity), zap.Uint32("min_kbps", c.MinKbps),
				zap.Uint32("max_kbps", c.MaxKbps), zap.Int("max_paced_queues", c.MaxQueues), zap.Stringer("policy", c.Policy))
		}
		ri.rates = t
	}
}

// pacingOptionLen is the GETSOCKOPT answer for SO_MAX_PACING_RATE: the
// extended struct as C lays it out (12 bytes with its padding), then the
// device's range in kbit/s (docs/protocol.md).
const pacingOptionLen = 20

// parsePacing decodes a SO_MAX_PACING_RATE value: a u32 in bytes/s, or the
// extended struct {rate kbit/s u32, max_burst_sz u32, typical_pkt_sz u16}
// (10 bytes, or 12 with C's padding). ok is false for "no limit": 0 in
// either form, or 0xFFFFFFFF bytes/s (Linux's ~0U).
func parsePacing(v []byte) (r pacing.Rate, ok bool, err error) {
	le := binary.LittleEndian
	switch len(v) {
	case 4:
		bps := le.Uint32(v)
		if bps == 0 || bps == math.MaxUint32 {
			return r, false, nil
		}
		// Below 125 bytes/s this is 0 kbit/s: on, and refused by the
		// range check, not taken for "no limit".
		r.Kbps = pacing.KbpsFromBytesPerSecond(bps)
	case 10, 12:
		if len(v) == 12 && (v[10] != 0 || v[11] != 0) {
			return r, false, fmt.Errorf("SO_MAX_PACING_RATE: the 12-byte struct's padding (bytes 10-11) must be zero: %w", unix.EINVAL)
		}
		r = pacing.Rate{Kbps: le.Uint32(v[0:]), MaxBurst: le.Uint32(v[4:]), TypicalBytes: le.Uint16(v[8:])}
		if r.Kbps == 0 {
			return pacing.Rate{}, false, nil
		}
	default:
		return r, false, fmt.Errorf("SO_MAX_PACING_RATE: value of %d bytes; want a u32 (bytes/s) or the 10-byte struct "+
			"{rate kbit/s u32, max_burst_sz u32, typical_pkt_sz u16}: %w", len(v), unix.EINVAL)
	}
	return r, true, nil
}

// setPacing is SETSOCKOPT SO_MAX_PACING_RATE: take a reference on the
// rate's table entry (refused when out of range or when the table is
// full), then drop the old one, and pace the endpoint if bound.
func (k *socket) setPacing(v []byte) error {
	r, on, err := parsePacing(v)
	if err != nil {
		return err
	}
	t := k.home.rates
	if !on {
		k.dropPacing()
		return nil
	}
	if k.rate != nil && k.rateReq == r {
		return nil // unchanged: keep the entry (and the pacer's state)
	}
	e, err := t.Acquire(r)
	if err != nil {
		if len(v) == 4 {
			return fmt.Errorf("SO_MAX_PACING_RATE %d bytes/s: %w", binary.LittleEndian.Uint32(v), err)
		}
		return fmt.Errorf("SO_MAX_PACING_RATE: %w", err)
	}
	t.Release(k.rate)
	k.rate, k.rateReq = e, r
	k.applyPacing()
	return nil
}

// dropPacing removes the socket's limit and releases its entry.
func (k *socket) dropPacing() {
	if k.rate == nil {
		return
	}
	k.home.rates.Release(k.rate)
	k.rate, k.rateReq = nil, pacing.Rate{}
	k.applyPacing()
}

// applyPacing gives the socket's rate (nil: none) to what sends for it: a
// datagram socket's endpoint, or a stream socket's connection (a listener's
// rate goes to the connections it accepts).
func (k *socket) applyPacing() {
	var r *pacing.Rate
	if k.rate != nil {
		r = &k.rate.Rate
	}
	switch {
	case k.ep != nil:
		k.ep.SetPacing(r)
	case k.stream != nil:
		st := k.stream
		st.opts.sndBufCap = 0
		if r != nil {
			st.opts.sndBufCap = int32(ring.PacedSendBuffer(*r))
		}
		if st.conn != nil {
			st.conn.SetPacing(r)
			st.opts.apply(st.conn.Endpoint().EP)
		}
	}
}

// pacingValue is GETSOCKOPT SO_MAX_PACING_RATE: the rate the socket is
// paced at (zero when unpaced) and the device's range.
func (k *socket) pacingValue() []byte {
	b := make([]byte, pacingOptionLen)
	le := binary.LittleEndian
	if k.rate != nil {
		r := k.rate.Rate
		le.PutUint32(b[0:], r.Kbps)
		le.PutUint32(b[4:], r.Burst())
		le.PutUint16(b[8:], r.TypicalBytes)
	}
	c := k.home.rates.Config()
	le.PutUint32(b[12:], c.MinKbps)
	le.PutUint32(b[16:], c.MaxKbps)
	return b
}

// queryRates answers QUERY rates: every interface's table once.
func (d *Daemon) queryRates(*session) (any, error) {
	doc := ctldoc.RatesDoc{Tables: []ctldoc.RateTableDoc{}}
	seen := map[*pacing.Table]bool{}
	for _, ri := range d.rings {
		t := ri.rates
		if t == nil || seen[t] {
			continue
		}
		seen[t] = true
		snap := t.Snapshot()
		st := t.Stats()
		td := ctldoc.RateTableDoc{
			Interface: ri.it.Name, Capacity: snap.Config.Capacity, Used: len(snap.Entries),
			MinKbps: snap.Config.MinKbps, MaxKbps: snap.Config.MaxKbps,
			Queues: snap.Queues, MaxQueues: snap.Config.MaxQueues, Policy: snap.Config.Policy.String(),
			Acquired: st.Acquired.Load(), Shared: st.Shared.Load(), Nearest: st.Nearest.Load(),
			RefusedFull: st.RefusedFull.Load(), RefusedRange: st.RefusedRange.Load(),
			Entries: []ctldoc.RateEntryDoc{},
		}
		for _, e := range snap.Entries {
			td.Entries = append(td.Entries, ctldoc.RateEntryDoc{Index: e.Index, Kbps: e.Rate.Kbps,
				MaxBurst: e.Rate.MaxBurst, TypicalBytes: e.Rate.TypicalBytes, Burst: e.Rate.Burst(), Users: e.Users})
		}
		doc.Tables = append(doc.Tables, td)
	}
	return doc, nil
}

// pacingCounters fills a ring block's pacing counters: the ring's own and
// its interface's rate table (the same on every ring of the interface).
func (ri *ringInfo) pacingCounters(c *stats.RingCounters) {
	rs := ri.ring().Stats()
	c[stats.RingPacedQueues] = rs.PacedQueues.Load()
	c[stats.RingTXPaced] = rs.TXPaced.Load()
	c[stats.RingTXPaceWaits] = rs.TXPaceWaits.Load()
	c[stats.RingTXPaceLate] = rs.TXPaceLate.Load()
	if ri.rates == nil {
		return
	}
	used, _ := ri.rates.Used()
	st := ri.rates.Stats()
	c[stats.RingRateEntries] = uint64(used)
	c[stats.RingRateCapacity] = uint64(ri.rates.Config().Capacity)
	c[stats.RingRateShared] = st.Shared.Load()
	c[stats.RingRateNearest] = st.Nearest.Load()
	c[stats.RingRateRefusedFull] = st.RefusedFull.Load()
	c[stats.RingRateRefusedRange] = st.RefusedRange.Load()
}
