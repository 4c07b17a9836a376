package daemon

import (
	"fmt"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring"
)

// A ring whose interface vanishes cannot be served, on any path: the TAP
// path needs the NIC too. Without a fallback the daemon stops (Serve
// returns the ring's error). With one (--fallback auto or tap) it keeps
// running: the ring is closed (which releases its endpoints), every socket
// homed on it gets a SOCKET_ERROR (ENETDOWN) to its client, which then
// closes it, new sockets on it are refused with ENETDOWN, and once an
// interface of that name is back the ring is opened again and serves new
// sockets.

// interfacePoll is how often a ring whose interface vanished looks for it.
const interfacePoll = 200 * time.Millisecond

// recoverRing takes over a failed ring when its interface vanished and the
// ring has a TAP fallback, and reports whether it did (false: the daemon
// must stop).
func (d *Daemon) recoverRing(f ringFailure, failed chan ringFailure) bool {
	ri := f.ri
	if ri.cfg.Fallback == ring.FallbackNone || d.isStopping() {
		return false
	}
	d.nlMu.Lock()
	_, err := d.nl.LinkByIndex(f.r.Ifindex())
	d.nlMu.Unlock()
	if err == nil {
		return false // the interface is there: something else broke
	}
	cause := f.err
	ri.down.Store(&cause)
	if err := f.r.Close(); err != nil {
		ri.log.Debug("closing the ring of a vanished interface", zap.Error(err))
	}
	n := d.dropSockets(ri)
	ri.log.Warn("interface gone: its sockets were dropped; waiting for it to come back",
		zap.Error(cause), zap.Int("sockets_dropped", n))
	d.recoverWG.Add(1)
	go d.awaitInterface(ri, failed)
	return true
}

// dropSockets tells every client with SOCKET_ERROR which of its sockets
// were homed on ri. It returns how many.
func (d *Daemon) dropSockets(ri *ringInfo) int {
	d.mu.Lock()
	sessions := make([]*session, 0, len(d.sessions))
	for s := range d.sessions {
		sessions = append(sessions, s)
	}
	d.mu.Unlock()
	n := 0
	for _, s := range sessions {
		n += s.dropRing(ri)
	}
	return n
}

// dropRing tells the client which of its sockets were homed on ri. Their
// endpoints go with the ring (its Close releases steering, reservations and
// memberships); what the session still holds for them (memory, eventfds)
// goes when the client closes them, in the session's own goroutine, which
// alone changes its socket table.
func (s *session) dropRing(ri *ringInfo) int {
	s.pub.Lock()
	var dead []*socket
	for _, k := range s.sockets {
		if k.home == ri {
			dead = append(dead, k)
		}
	}
	s.changes.Add(1)
	s.pub.Unlock()
	for _, k := range dead {
		err := s.conn.Send(ctlproto.Header{Code: ctlproto.CodeSocketError, Socket: k.id},
			ctlproto.SocketError{Errno: uint32(unix.ENETDOWN)})
		if err != nil {
			s.log.Debug("cannot send SOCKET_ERROR", zap.Uint32("socket", k.id), zap.Error(err))
		}
	}
	return len(dead)
}

// awaitInterface opens ri's ring again once its interface is back.
func (d *Daemon) awaitInterface(ri *ringInfo, failed chan<- ringFailure) {
	defer d.recoverWG.Done()
	t := time.NewTicker(interfacePoll)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		if d.isStopping() {
			return
		}
		d.nlMu.Lock()
		_, err := d.nl.LinkByName(ri.it.Name)
		d.nlMu.Unlock()
		if err != nil {
			continue
		}
		r, err := d.openRing(ri.cfg)
		if err != nil {
			if err.Error() != lastErr {
				ri.log.Info("interface back, but its ring does not open yet; retrying", zap.Error(err))
				lastErr = err.Error()
			}
			continue
		}
		d.mu.Lock()
		if d.stopping {
			d.mu.Unlock()
			_ = r.Close()
			return
		}
		ri.r.Store(r)
		d.applyQoS(ri)
		ri.down.Store(nil)
		d.mu.Unlock()
		d.watchRing(ri, r, failed)
		ri.log.Info("interface back: ring open again", zap.Int("ifindex", r.Ifindex()))
		return
	}
}

// openRing opens a ring on a thread in the daemon's network namespace (the
// one New ran in).
func (d *Daemon) openRing(cfg ring.Config) (*ring.Ring, error) {
	type result struct {
		r   *ring.Ring
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, so no
		// other goroutine inherits its namespace.
		runtime.LockOSThread()
		if err := netns.Set(d.netns); err != nil {
			ch <- result{err: fmt.Errorf("enter the daemon's network namespace: %w", err)}
			return
		}
		r, err := ring.Open(cfg)
		ch <- result{r, err}
	}()
	res := <-ch
	return res.r, res.err
}

// downErr is the error of a request on a ring whose interface is gone.
func (ri *ringInfo) downErr() error {
	if p := ri.down.Load(); p != nil {
		return fmt.Errorf("interface %s is gone (%v); retry once it is back: %w", ri.it.Name, *p, unix.ENETDOWN)
	}
	return nil
}
