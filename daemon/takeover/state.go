package takeover

import (
	"encoding/json"
	"fmt"
)

// Version is the state document version this build writes. Version 2
// hands the rings' AF_XDP sockets over (Ring.Path); a version 1 offerer
// empties its XSKMAP slots instead and the taker opens sockets of its own.
// Version 3: sessions carry their session memory and client eventfd
// (control protocol version 2); earlier ones carried a memfd and two
// eventfds per socket.
const Version = 3

// MinVersion is the oldest state document version this build reads (a
// version 1 daemon's clients speak a protocol this build does not).
const MinVersion = 3

// NoFD marks a descriptor reference that is not in use.
const NoFD = -1

// Choose returns the document version an offerer writing MinVersion..Version
// sends to a taker that reads minV..maxV: the newest both know. The error
// says which side to change.
func Choose(minV, maxV int) (int, error) {
	if minV <= 0 || minV > maxV {
		return 0, fmt.Errorf("takeover: the new daemon reads state versions %d..%d, an empty range", minV, maxV)
	}
	v := min(maxV, Version)
	if v < max(minV, MinVersion) {
		return 0, fmt.Errorf("takeover: the new daemon reads state versions %d..%d, this daemon writes %d..%d: "+
			"upgrade in steps through a release that knows both, or restart the daemon (clients reconnect)", minV, maxV, MinVersion, Version)
	}
	return v, nil
}

// State is the document an old daemon hands to its successor. Descriptor
// fields hold indexes into the descriptors sent with it (NoFD: none).
type State struct {
	Version int `json:"version"`
	// PID and Build name the writer, for logs.
	PID   int    `json:"pid"`
	Build string `json:"build,omitempty"`
	// Listener is the control socket's listening descriptor and Path its
	// file; Metrics the /metrics HTTP listener (NoFD: none).
	Listener int    `json:"listener"`
	Path     string `json:"path"`
	Metrics  int    `json:"metrics"`
	// Locks are the per-interface lock files (the flock moves with the
	// descriptor).
	Locks []Lock `json:"locks,omitempty"`
	// Programs are the XDP steering programs, one per interface.
	Programs []Program `json:"programs,omitempty"`
	Rings    []Ring    `json:"rings,omitempty"`
	// NextSocket is the last socket id handed out.
	NextSocket uint32    `json:"next_socket"`
	Sessions   []Session `json:"sessions,omitempty"`
	// Control is the control plane's counters, by name.
	Control map[string]uint64 `json:"control,omitempty"`
}

// Lock is one interface lock file.
type Lock struct {
	Interface string `json:"interface"`
	Path      string `json:"path"`
	FD        int    `json:"fd"`
}

// Program is an interface's attached XDP program: its bpf_link, the
// program and its maps by name, so steering never detaches.
type Program struct {
	Interface string         `json:"interface"`
	Ifindex   int            `json:"ifindex"`
	Mode      string         `json:"mode"`
	Link      int            `json:"link"`
	Prog      int            `json:"prog"`
	Maps      map[string]int `json:"maps"`
}

// Ring is one (interface, queue) ring: the doorbell clients hold and,
// from version 2, its fast path (Path). Without a Path (version 1) the new
// daemon opens its own AF_XDP socket on the queue once the old one left it.
type Ring struct {
	Interface string            `json:"interface"`
	Queue     int               `json:"queue"`
	Doorbell  int               `json:"doorbell"`
	Counters  map[string]uint64 `json:"counters,omitempty"`
	Path      *Path             `json:"path,omitempty"`
}

// Path is a ring's fast path: the AF_XDP socket (which stays in its queue
// and XSKMAP slot), the memfd of its UMEM, the standby TAP device (NoFD:
// none) and the socket's layout (ring/provider/afxdp.Layout). Final.Paths
// carries the engine's state once the old ring stopped.
type Path struct {
	XSK    int             `json:"xsk"`
	UMEM   int             `json:"umem"`
	TAP    int             `json:"tap"`
	Layout json.RawMessage `json:"layout"`
}

// Session is one connected client.
type Session struct {
	Conn    int    `json:"conn"`
	PID     int32  `json:"pid"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Program string `json:"program,omitempty"`
	Hello   bool   `json:"hello"`
	// Stats: the client has a stats file.
	Stats  bool   `json:"stats"`
	Opened uint64 `json:"opened"`
	// Memory is the session memory's memfd (NoFD: a tool session
	// without one), MemSize its size, MaxSlots and Lanes its layout's
	// parameters (docs/shm-queue.md); ClientWake is the eventfd the
	// client sleeps on, Doorbells the lane doorbells the client rings,
	// one per lane (none from a daemon whose clients rang the rings'
	// shared doorbells).
	Memory     int      `json:"memory"`
	MemSize    int64    `json:"mem_size,omitempty"`
	MaxSlots   int      `json:"max_slots,omitempty"`
	Lanes      int      `json:"lanes,omitempty"`
	ClientWake int      `json:"client_wake"`
	Doorbells  []int    `json:"doorbells,omitempty"`
	Sockets    []Socket `json:"sockets,omitempty"`
	// Retired is the summed counters of the session's closed sockets.
	Retired map[string]uint64 `json:"retired,omitempty"`
}

// Socket is one client socket.
type Socket struct {
	ID         uint32 `json:"id"`
	Family     uint16 `json:"family"`
	QueueBytes int    `json:"queue_bytes"`
	// Slot is the socket's bit in the session memory's bitmaps, TXOffset
	// and RXOffset its queues there.
	Slot     int   `json:"slot"`
	TXOffset int64 `json:"tx_offset"`
	RXOffset int64 `json:"rx_offset"`
	// Ring is the home ring's index in State.Rings.
	Ring         int       `json:"ring"`
	ReuseAddr    bool      `json:"reuse_addr,omitempty"`
	Options      Options   `json:"options"`
	Rate         *Rate     `json:"rate,omitempty"`
	RateRequest  *Rate     `json:"rate_request,omitempty"`
	Timestamping uint32    `json:"timestamping,omitempty"`
	Pending      []Group   `json:"pending,omitempty"`
	Endpoint     *Endpoint `json:"endpoint,omitempty"`
}

// Options are a socket's header options.
type Options struct {
	TTL           uint8 `json:"ttl"`
	MulticastTTL  uint8 `json:"multicast_ttl"`
	TOS           uint8 `json:"tos"`
	MulticastLoop bool  `json:"multicast_loop"`
}

// Rate is a pacing rate.
type Rate struct {
	Kbps         uint32 `json:"kbps"`
	MaxBurst     uint32 `json:"max_burst"`
	TypicalBytes uint16 `json:"typical_bytes"`
}

// Endpoint is a bound socket's ring state: its address, its peer, the
// kernel port reservation (which holds the kernel's multicast
// memberships, and the datagrams the kernel received for the port while
// no AF_XDP socket served it), its memberships and its counters.
type Endpoint struct {
	Local       string            `json:"local"`
	Peer        string            `json:"peer,omitempty"`
	Reservation int               `json:"reservation"`
	Steered     []string          `json:"steered,omitempty"`
	Groups      []Group           `json:"groups,omitempty"`
	Counters    map[string]uint64 `json:"counters,omitempty"`
}

// Group is a multicast membership (Sources: source-specific).
type Group struct {
	Group   string   `json:"group"`
	Sources []string `json:"sources,omitempty"`
}

// Final is what the offerer sends once it released the data path: the
// counters that moved after the document was written and, for rings
// handed over with their Path, each engine's state (ring.PathState).
type Final struct {
	Rings     []map[string]uint64          `json:"rings"`
	Endpoints map[uint32]map[string]uint64 `json:"endpoints,omitempty"`
	Paths     []json.RawMessage            `json:"paths,omitempty"`
}

// Encode returns the document's JSON.
func (s *State) Encode() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("takeover: encode state: %w", err)
	}
	return b, nil
}

// Decode parses a document of a version this build reads and checks that
// every descriptor reference is below nfds.
func Decode(b []byte, nfds int) (*State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("takeover: decode state: %w", err)
	}
	if s.Version < MinVersion || s.Version > Version {
		return nil, fmt.Errorf("takeover: state version %d, this daemon reads %d..%d", s.Version, MinVersion, Version)
	}
	if err := s.checkRefs(nfds); err != nil {
		return nil, fmt.Errorf("takeover: state: %w", err)
	}
	return &s, nil
}

// checkRefs verifies that every descriptor index is NoFD or below n, and
// that required ones are present.
func (s *State) checkRefs(n int) error {
	bad := func(what string, i int, required bool) error {
		if i == NoFD && !required {
			return nil
		}
		if i < 0 || i >= n {
			return fmt.Errorf("%s refers to descriptor %d of %d", what, i, n)
		}
		return nil
	}
	var errs []error
	add := func(e error) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	add(bad("listener", s.Listener, true))
	add(bad("metrics", s.Metrics, false))
	for _, l := range s.Locks {
		add(bad("lock "+l.Interface, l.FD, true))
	}
	for _, p := range s.Programs {
		add(bad("program link "+p.Interface, p.Link, true))
		add(bad("program "+p.Interface, p.Prog, true))
		for name, m := range p.Maps {
			add(bad("map "+name, m, true))
		}
	}
	for _, r := range s.Rings {
		add(bad(fmt.Sprintf("ring %s/%d doorbell", r.Interface, r.Queue), r.Doorbell, true))
		if r.Path != nil {
			add(bad(fmt.Sprintf("ring %s/%d socket", r.Interface, r.Queue), r.Path.XSK, true))
			add(bad(fmt.Sprintf("ring %s/%d UMEM", r.Interface, r.Queue), r.Path.UMEM, true))
			add(bad(fmt.Sprintf("ring %s/%d TAP", r.Interface, r.Queue), r.Path.TAP, false))
		}
	}
	for _, ss := range s.Sessions {
		add(bad(fmt.Sprintf("session %d", ss.PID), ss.Conn, true))
		mem := ss.Memory != NoFD
		add(bad(fmt.Sprintf("session %d memory", ss.PID), ss.Memory, false))
		add(bad(fmt.Sprintf("session %d client eventfd", ss.PID), ss.ClientWake, mem))
		if len(ss.Doorbells) != 0 && (!mem || len(ss.Doorbells) != ss.Lanes) {
			add(fmt.Errorf("session %d: %d lane doorbells for %d lanes: the state document is inconsistent (the old bypassd keeps serving; upgrade by restarting instead of --takeover)", ss.PID, len(ss.Doorbells), ss.Lanes))
		}
		for i, fd := range ss.Doorbells {
			add(bad(fmt.Sprintf("session %d lane %d doorbell", ss.PID, i), fd, true))
		}
		if !mem && len(ss.Sockets) > 0 {
			add(fmt.Errorf("session %d: %d sockets and no session memory", ss.PID, len(ss.Sockets)))
		}
		for _, k := range ss.Sockets {
			what := fmt.Sprintf("socket %d", k.ID)
			if k.Ring < 0 || k.Ring >= len(s.Rings) {
				add(fmt.Errorf("%s: ring %d of %d", what, k.Ring, len(s.Rings)))
			}
			if k.Endpoint != nil {
				add(bad(what+" reservation", k.Endpoint.Reservation, true))
			}
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Table collects the descriptors an offerer sends with its document.
type Table struct{ fds []int }

// Add appends fd (still the caller's) and returns the index the document
// names it by.
func (t *Table) Add(fd int) int {
	t.fds = append(t.fds, fd)
	return len(t.fds) - 1
}

// FDs returns the descriptors in index order.
func (t *Table) FDs() []int { return t.fds }
