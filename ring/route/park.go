package route

import (
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/fdpark"
)

// parkTableFiles is the size of each io_uring file table reservations are
// parked in: one descriptor per that many reservations.
const parkTableFiles = 4096

// park holds the reservation sockets of this process without a
// descriptor each (package fdpark): a daemon serving 100,000 bound sockets
// would otherwise need as many descriptors, beyond common RLIMIT_NOFILE
// limits. Made on first use; nil when io_uring cannot do it here (then
// each reservation keeps its descriptor, see ParkStatus).
var park = sync.OnceValues(func() (*fdpark.Park, error) { return fdpark.New(parkTableFiles) })

// ParkStatus says how reservations are held: nil when they are parked in
// io_uring file tables (a descriptor per 4,096 of them), else why each
// keeps a descriptor of its own.
func ParkStatus() error {
	_, err := park()
	return err
}

// sock is a reservation's socket: a descriptor of its own, or a slot in
// the park. The Reservation's mu guards it.
type sock struct {
	f      *os.File // nil when parked or closed
	slot   fdpark.Slot
	parked bool
}

// newSock takes over fd, parking it when possible.
func newSock(fd int, name string) sock {
	if p, err := park(); err == nil {
		if s, err := p.Put(fd); err == nil {
			return sock{slot: s, parked: true}
		}
		// Put closed fd on error: a socket lost this way fails its
		// reservation below instead of leaking.
		return sock{}
	}
	return sock{f: os.NewFile(uintptr(fd), name)}
}

func (s *sock) open() bool { return s.f != nil || s.parked }

// withFD runs fn with a descriptor of the socket (the parked one's is
// installed for the call and closed after it).
func (r *Reservation) withFD(fn func(fd int) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.s.open() {
		return fmt.Errorf("route: %s reservation %v: %w", r.network, r.addr, net.ErrClosed)
	}
	if r.s.f != nil {
		return fn(int(r.s.f.Fd()))
	}
	p, _ := park()
	fd, err := p.Get(r.s.slot)
	if err != nil {
		return fmt.Errorf("route: %s reservation %v: %w", r.network, r.addr, err)
	}
	defer unix.Close(fd)
	return fn(fd)
}

// closeSock releases the socket (the caller holds r.mu).
func (r *Reservation) closeSock() error {
	var err error
	switch {
	case r.s.parked:
		p, _ := park()
		p.Drop(r.s.slot)
	case r.s.f != nil:
		err = r.s.f.Close()
	}
	r.s = sock{}
	return err
}
