package netlab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsRunDir is where iproute2 looks for named namespaces.
const netnsRunDir = "/run/netns"

// NS is a named network namespace created by the lab (visible to
// `ip netns exec NAME`). Its handles are owned by the lab and stay valid
// until the Pair that created it is closed.
type NS struct {
	Name string

	mu      sync.RWMutex
	handle  netns.NsHandle
	nl      *netlink.Handle
	deleted bool
}

// Path returns the bind-mount path of the namespace (/run/netns/NAME).
func (ns *NS) Path() string { return filepath.Join(netnsRunDir, ns.Name) }

// Handle returns the namespace file descriptor. It is owned by the lab: do
// not close it. After the Pair is closed it is invalid.
func (ns *NS) Handle() netns.NsHandle {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	return ns.handle
}

// Netlink returns a netlink handle bound to the namespace. It is owned by the
// lab: do not close it. It must not be used after the Pair is closed.
func (ns *NS) Netlink() *netlink.Handle {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	return ns.nl
}

// Do runs fn on the calling goroutine, locked to its OS thread, with that
// thread switched into the namespace, and switches the thread back
// afterwards (also when fn panics or calls runtime.Goexit, e.g. t.Fatal).
// Sockets created inside fn stay in the namespace after Do returns;
// goroutines started inside fn do not run in it.
//
// If the thread cannot be switched back it is never handed back to the
// scheduler: the calling goroutine stays locked to it and the runtime
// destroys the thread when that goroutine exits.
func (ns *NS) Do(fn func() error) (err error) {
	if fn == nil {
		return fmt.Errorf("netlab: %s.Do: nil function", ns.Name)
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netlab: %s.Do: get current netns: %w", ns.Name, err)
	}
	if err := ns.enter(); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		return err
	}
	defer func() {
		rerr := netns.Set(orig)
		orig.Close()
		if rerr != nil {
			// Deliberately stay locked: the thread is in the wrong namespace.
			err = errors.Join(err, fmt.Errorf("netlab: %s.Do: restore thread netns: %w (thread retired)", ns.Name, rerr))
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// enter switches the current (locked) thread into ns.
func (ns *NS) enter() error {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	if ns.deleted || !ns.handle.IsOpen() {
		return fmt.Errorf("netlab: namespace %s is closed", ns.Name)
	}
	if err := netns.Set(ns.handle); err != nil {
		return fmt.Errorf("netlab: enter namespace %s: %w", ns.Name, err)
	}
	return nil
}

// Command returns a command that runs name with args inside the namespace
// via `ip netns exec` (which also gives it a matching /sys and
// /etc/netns/NAME files). A nil ctx means context.Background(). The caller
// must wait for the command before closing the Pair; a running process keeps
// the namespace alive.
func (ns *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if ctx == nil {
		ctx = context.Background()
	}
	full := append([]string{"netns", "exec", ns.Name, name}, args...)
	return exec.CommandContext(ctx, "ip", full...)
}

// openNS creates the named namespace and opens the lab's handles to it.
func openNS(name string) (*NS, error) {
	if err := createNamedNS(name); err != nil {
		return nil, err
	}
	ns := &NS{Name: name, handle: netns.None()}
	h, err := netns.GetFromPath(ns.Path())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: open namespace %s: %w", name, err), ns.close())
	}
	ns.handle = h
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: netlink handle in %s: %w", name, err), ns.close())
	}
	ns.nl = nl
	return ns, nil
}

// close releases the lab's handles and deletes the namespace. It can be
// called again after a failure to retry the deletion.
func (ns *NS) close() error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.deleted {
		return nil
	}
	// Netlink sockets and the fd pin the namespace: drop them first so
	// deleting the mount really destroys it (and the veth in it).
	if err := ns.releaseLocked(); err != nil {
		return err
	}
	if err := deleteNamedNS(ns.Name); err != nil {
		return err
	}
	ns.deleted = true
	return nil
}

// release closes the lab's handles but leaves the namespace in place.
func (ns *NS) release() error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return ns.releaseLocked()
}

func (ns *NS) releaseLocked() error {
	if ns.nl != nil {
		ns.nl.Close()
		ns.nl = nil
	}
	if ns.handle.IsOpen() {
		if err := ns.handle.Close(); err != nil {
			return fmt.Errorf("netlab: close handle of %s: %w", ns.Name, err)
		}
		ns.handle = netns.None()
	}
	return nil
}

// errNSExists marks a name collision with an existing namespace.
var errNSExists = errors.New("namespace exists")

// createNamedNS creates a network namespace and bind-mounts it at
// /run/netns/name, the way `ip netns add` does, without leaving any thread
// of this process in it.
func createNamedNS(name string) (err error) {
	if err := prepareRunDir(); err != nil {
		return err
	}
	path := filepath.Join(netnsRunDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("netlab: namespace %s already exists; remove it with `ip netns del %s` (or `netlab down`/`netlab sweep`): %w", name, name, errNSExists)
	}
	if err != nil {
		return fmt.Errorf("netlab: create mount point %s: %w", path, err)
	}
	f.Close()
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()

	// A fresh goroutine so that, if the thread cannot return to the original
	// namespace, it dies with the goroutine instead of running other code.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netlab: create namespace %s: get current netns: %w", name, err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netlab: create namespace %s: unshare: %w", name, err)
			return
		}
		merr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if merr != nil {
			merr = fmt.Errorf("netlab: create namespace %s: bind mount: %w", name, merr)
		}
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked; it is destroyed when we return.
			errc <- errors.Join(merr, fmt.Errorf("netlab: create namespace %s: return to original netns: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- merr
	}()
	if err := <-errc; err != nil {
		// The bind mount may exist even if restoring the thread failed.
		return errors.Join(err, deleteNamedNS(name))
	}
	return nil
}

// deleteNamedNS unmounts and removes /run/netns/name like `ip netns del`.
// A missing namespace is not an error.
func deleteNamedNS(name string) error {
	path := filepath.Join(netnsRunDir, name)
	// Loop because racing creators can stack several mounts on one file.
	for i := 0; i < 16; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if err == nil {
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // no (more) mounts
		}
		return fmt.Errorf("netlab: unmount namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("netlab: remove %s: %w", path, err)
	}
	return nil
}

var runDir struct {
	mu    sync.Mutex
	ready bool
}

// prepareRunDir makes /run/netns a shared mount point, as iproute2 does.
// Shared propagation matters: processes started with `ip netns exec` run in
// a copy of our mount table, and without propagation their copy would keep
// every lab namespace that existed at their start alive after we delete it.
func prepareRunDir() error {
	runDir.mu.Lock()
	defer runDir.mu.Unlock()
	if runDir.ready {
		return nil
	}
	if err := os.MkdirAll(netnsRunDir, 0o755); err != nil {
		return fmt.Errorf("netlab: create %s: %w", netnsRunDir, err)
	}
	dir, err := os.Open(netnsRunDir)
	if err != nil {
		return fmt.Errorf("netlab: open %s: %w", netnsRunDir, err)
	}
	defer dir.Close()
	// Serialise with other lab processes so that two of them do not both
	// bind-mount the directory onto itself (a stacked mount hides entries).
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("netlab: lock %s: %w", netnsRunDir, err)
	}
	defer unix.Flock(int(dir.Fd()), unix.LOCK_UN)
	for attempt := 0; ; attempt++ {
		err := unix.Mount("", netnsRunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			runDir.ready = true
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || attempt > 0 {
			return fmt.Errorf("netlab: make %s a shared mount: %w", netnsRunDir, err)
		}
		// EINVAL: not a mount point yet. Bind it onto itself, then retry.
		if err := unix.Mount(netnsRunDir, netnsRunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netlab: bind mount %s onto itself: %w", netnsRunDir, err)
		}
	}
}

// ListenUDP opens an ordinary kernel UDP socket bound to addr inside ns, for
// a test's peer; it is closed when the test ends.
func (ns *NS) ListenUDP(tb testing.TB, addr netip.AddrPort) *net.UDPConn {
	tb.Helper()
	var c *net.UDPConn
	err := ns.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		tb.Fatalf("kernel UDP socket %v in %s: %v", addr, ns.Name, err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// ListenTCP opens an ordinary kernel TCP listener on addr inside ns, for a
// test's peer; it is closed when the test ends.
func (ns *NS) ListenTCP(tb testing.TB, addr netip.AddrPort) *net.TCPListener {
	tb.Helper()
	var l *net.TCPListener
	err := ns.Do(func() error {
		var err error
		l, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		tb.Fatalf("kernel TCP listener %v in %s: %v", addr, ns.Name, err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

// DialTCP connects an ordinary kernel TCP socket from inside ns to addr.
func (ns *NS) DialTCP(addr netip.AddrPort, timeout time.Duration) (*net.TCPConn, error) {
	var c *net.TCPConn
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.Dial("tcp", addr.String())
		if err != nil {
			return err
		}
		c = conn.(*net.TCPConn)
		return nil
	})
	return c, err
}

// TCPStat reads a counter of the Tcp line of ns's /proc/net/snmp (for
// example "ActiveOpens", "PassiveOpens", "OutSegs"): the kernel's own TCP
// work in that namespace, IPv4 and IPv6 together.
func (ns *NS) TCPStat(tb testing.TB, field string) uint64 {
	tb.Helper()
	var val uint64
	err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Tcp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i, n := range names {
				if n == field && i < len(f) {
					val, err = strconv.ParseUint(f[i], 10, 64)
					return err
				}
			}
		}
		return fmt.Errorf("Tcp %s not in /proc/net/snmp", field)
	})
	if err != nil {
		tb.Fatalf("read TCP counter %s in %s: %v", field, ns.Name, err)
	}
	return val
}
