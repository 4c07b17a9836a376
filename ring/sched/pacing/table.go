package pacing

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// FullPolicy is what a Table does when a new rate needs an entry and none
// is free.
type FullPolicy int

const (
	// Refuse fails the request with ENOSPC (the default).
	Refuse FullPolicy = iota
	// Nearest shares the existing entry whose rate is closest to the one
	// asked for (ties go to the lower rate); the socket gets that rate.
	Nearest
)

func (p FullPolicy) String() string {
	if p == Nearest {
		return "nearest"
	}
	return "refuse"
}

// ParseFullPolicy parses "refuse" or "nearest".
func ParseFullPolicy(s string) (FullPolicy, error) {
	switch s {
	case "refuse", "":
		return Refuse, nil
	case "nearest":
		return Nearest, nil
	}
	return 0, fmt.Errorf("rate table policy %q: want refuse or nearest", s)
}

// Table defaults (see TableConfig).
const (
	DefaultCapacity  = 16
	DefaultMinKbps   = 1_000       // 1 Mbit/s
	DefaultMaxKbps   = 100_000_000 // 100 Gbit/s
	DefaultMaxQueues = 512
)

// TableConfig sizes a device's rate table. Zero fields take the defaults,
// which follow ConnectX-4's: 16 entries, up to 512 paced send queues.
type TableConfig struct {
	// Device names the table in errors (the interface name).
	Device string
	// Capacity is the number of distinct rates (default 16).
	Capacity int
	// MinKbps and MaxKbps bound the rates (the device's
	// qp_rate_limit_min/max; defaults 1 Mbit/s and 100 Gbit/s).
	MinKbps, MaxKbps uint32
	// MaxQueues bounds the paced send queues, that is the references held
	// on all entries together (default 512).
	MaxQueues int
	// Policy decides what happens when the table is full.
	Policy FullPolicy
}

func (c *TableConfig) setDefaults() {
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	if c.MinKbps == 0 {
		c.MinKbps = DefaultMinKbps
	}
	if c.MaxKbps == 0 {
		c.MaxKbps = DefaultMaxKbps
	}
	if c.MaxQueues == 0 {
		c.MaxQueues = DefaultMaxQueues
	}
}

// Validate reports a configuration that cannot work, in words an operator
// can act on.
func (c TableConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Capacity < 0 || c.Capacity > 65535:
		return fmt.Errorf("rate table capacity %d: want 1..65535", c.Capacity)
	case c.MaxQueues < 0:
		return fmt.Errorf("max paced queues %d: want at least 1", c.MaxQueues)
	case c.MinKbps > c.MaxKbps:
		return fmt.Errorf("pacing rate range %d..%d kbit/s: the minimum is above the maximum", c.MinKbps, c.MaxKbps)
	case c.Policy != Refuse && c.Policy != Nearest:
		return fmt.Errorf("rate table policy %d: want refuse or nearest", c.Policy)
	}
	return nil
}

// Entry is one rate of a Table, shared by every queue paced at it.
type Entry struct {
	Index int
	Rate  Rate
	refs  int
}

// Table is a device's rate table: a scarce set of rates that paced send
// queues draw on. Identical Rates share one reference-counted entry; the
// last Release frees it. Safe for concurrent use.
type Table struct {
	cfg     TableConfig
	mu      sync.Mutex
	entries []*Entry // by index; nil = free
	byRate  map[Rate]*Entry
	queues  int
	stats   TableStats
}

// TableStats are a table's cumulative counters.
type TableStats struct {
	// Acquired counts successful Acquire calls; Shared those that reused
	// an existing entry (Nearest substitutions included); Nearest those
	// that got a different rate because the table was full.
	Acquired, Shared, Nearest atomic.Uint64
	// RefusedFull counts requests refused because the table or the paced
	// queue limit was full; RefusedRange those outside MinKbps..MaxKbps.
	RefusedFull, RefusedRange atomic.Uint64
}

// NewTable returns an empty table (cfg is validated by the caller with
// Validate; invalid values are clamped to the defaults).
func NewTable(cfg TableConfig) *Table {
	cfg.setDefaults()
	if cfg.Validate() != nil {
		cfg = TableConfig{Device: cfg.Device}
		cfg.setDefaults()
	}
	return &Table{cfg: cfg, entries: make([]*Entry, cfg.Capacity), byRate: map[Rate]*Entry{}}
}

// Config returns the table's configuration with defaults filled in.
func (t *Table) Config() TableConfig { return t.cfg }

// Stats returns the table's counters.
func (t *Table) Stats() *TableStats { return &t.stats }

// CheckRange fails with ERANGE, naming the range, when kbps is outside it.
func (t *Table) CheckRange(kbps uint32) error {
	if kbps < t.cfg.MinKbps || kbps > t.cfg.MaxKbps {
		return fmt.Errorf("pacing rate %d kbit/s is outside %s's range %d..%d kbit/s (%d..%d bytes/s): %w",
			kbps, t.cfg.Device, t.cfg.MinKbps, t.cfg.MaxKbps,
			uint64(t.cfg.MinKbps)*125, uint64(t.cfg.MaxKbps)*125, unix.ERANGE)
	}
	return nil
}

// Acquire takes a reference on the entry for r, creating it if needed. The
// returned entry's Rate is what the queue must be paced at: r itself, or
// with the Nearest policy on a full table the closest existing rate.
// Errors: ERANGE (rate outside the range), ENOSPC (table full under
// Refuse, or MaxQueues queues paced already).
func (t *Table) Acquire(r Rate) (*Entry, error) {
	if err := t.CheckRange(r.Kbps); err != nil {
		t.stats.RefusedRange.Add(1)
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queues >= t.cfg.MaxQueues {
		t.stats.RefusedFull.Add(1)
		return nil, fmt.Errorf("%s already paces %d send queues, the most it allows: %w", t.cfg.Device, t.queues, unix.ENOSPC)
	}
	e := t.byRate[r]
	if e != nil {
		t.stats.Shared.Add(1)
	} else {
		free := -1
		for i, x := range t.entries {
			if x == nil {
				free = i
				break
			}
		}
		switch {
		case free >= 0:
			e = &Entry{Index: free, Rate: r}
			t.entries[free] = e
			t.byRate[r] = e
		case t.cfg.Policy == Nearest:
			e = t.nearestLocked(r.Kbps)
			t.stats.Shared.Add(1)
			t.stats.Nearest.Add(1)
		default:
			t.stats.RefusedFull.Add(1)
			return nil, fmt.Errorf("%s's rate table is full (%d rates in use; %s is not one of them): %w",
				t.cfg.Device, len(t.entries), r, unix.ENOSPC)
		}
	}
	e.refs++
	t.queues++
	t.stats.Acquired.Add(1)
	return e, nil
}

// nearestLocked returns the entry closest in rate to kbps (the table is
// full, so there is one).
func (t *Table) nearestLocked(kbps uint32) *Entry {
	var best *Entry
	var bestD uint64
	for _, e := range t.entries {
		d := absDiff(e.Rate.Kbps, kbps)
		if best == nil || d < bestD || (d == bestD && e.Rate.Kbps < best.Rate.Kbps) {
			best, bestD = e, d
		}
	}
	return best
}

func absDiff(a, b uint32) uint64 {
	if a > b {
		return uint64(a - b)
	}
	return uint64(b - a)
}

// Release drops one reference to e; the last frees the entry. Releasing
// nil does nothing.
func (t *Table) Release(e *Entry) {
	if e == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.refs <= 0 || t.entries[e.Index] != e {
		return // released already: a caller bug, but not a reason to corrupt the table
	}
	e.refs--
	t.queues--
	if e.refs == 0 {
		t.entries[e.Index] = nil
		delete(t.byRate, e.Rate)
	}
}

// EntryInfo is a snapshot of one entry.
type EntryInfo struct {
	Index int
	Rate  Rate
	// Users is the number of send queues paced at this rate.
	Users int
}

// Snapshot is a consistent view of a table.
type Snapshot struct {
	Config  TableConfig
	Entries []EntryInfo // in index order, used entries only
	// Queues is the number of paced send queues (references).
	Queues int
}

// Snapshot returns the table's entries and occupancy.
func (t *Table) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{Config: t.cfg, Queues: t.queues}
	for _, e := range t.entries {
		if e != nil {
			s.Entries = append(s.Entries, EntryInfo{Index: e.Index, Rate: e.Rate, Users: e.refs})
		}
	}
	sort.Slice(s.Entries, func(i, j int) bool { return s.Entries[i].Index < s.Entries[j].Index })
	return s
}

// Used returns the number of entries in use and the paced queue count.
func (t *Table) Used() (entries, queues int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byRate), t.queues
}
