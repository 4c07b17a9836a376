package ctlproto

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// listenBacklog is the listen(2) backlog; the kernel caps it at somaxconn.
const listenBacklog = 512

// probeTimeout bounds the connect that tells a live daemon from a stale file.
const probeTimeout = time.Second

// Listener accepts control connections on a socket file it created.
type Listener struct {
	path     string
	f        *os.File
	rc       syscall.RawConn
	dev, ino uint64 // identity of the socket file this listener created

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Listen creates the control socket at path with the given permission bits
// and group (gid -1 keeps the process's group), creating the parent
// directory (mode 0755) if needed. Whoever may write the socket file may
// connect, so mode and group decide who may use the daemon.
//
// It refuses to start when another live daemon answers on path ("another
// bypassd is running on PATH (pid N)"); a stale socket file left by a dead
// daemon (connect refused) is removed and replaced; anything at path that is
// not a socket is left alone and refused. The check and the bind happen
// under an exclusive flock of the parent directory so that two daemons
// starting at once cannot both win.
func Listen(path string, mode os.FileMode, gid int) (*Listener, error) {
	sa, err := sockaddr(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ctlproto: listen %s: create directory: %w", path, err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("ctlproto: listen %s: %w", path, err)
	}
	defer unlock()

	if err := clearStale(path); err != nil {
		return nil, err
	}

	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("ctlproto: listen %s: create socket: %w", path, err)
	}
	bound := false
	fail := func(e error) (*Listener, error) {
		unix.Close(fd)
		if bound {
			os.Remove(path)
		}
		return nil, e
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail(fmt.Errorf("ctlproto: listen %s: bind: %w", path, err))
	}
	bound = true
	// Permissions are set before listen(2): until then every connect is
	// refused, so nobody slips in under the umask's mode.
	if err := os.Chmod(path, mode.Perm()); err != nil {
		return fail(fmt.Errorf("ctlproto: listen %s: set mode %v: %w", path, mode.Perm(), err))
	}
	if gid >= 0 {
		if err := os.Lchown(path, -1, gid); err != nil {
			return fail(fmt.Errorf("ctlproto: listen %s: set group %d: %w (grant the daemon CAP_CHOWN, or run it as a member of that group)", path, gid, err))
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fail(fmt.Errorf("ctlproto: listen %s: stat: %w", path, err))
	}
	if err := unix.Listen(fd, listenBacklog); err != nil {
		return fail(fmt.Errorf("ctlproto: listen %s: %w", path, err))
	}
	f := os.NewFile(uintptr(fd), path)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("ctlproto: listen %s: %w", path, err)
	}
	return &Listener{path: path, f: f, rc: rc, dev: st.Dev, ino: st.Ino}, nil
}

// ListenerFromFD wraps fd, a listening AF_UNIX SOCK_SEQPACKET socket bound
// at path that another process handed over (live upgrade), and takes
// ownership of it. Close removes the socket file if it is still the one
// bound now.
func ListenerFromFD(fd int, path string) (*Listener, error) {
	if err := checkSocket(fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: adopt listener %s: %w", path, err)
	}
	if ok, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || ok == 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: adopt listener %s: the descriptor is not a listening socket", path)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: adopt listener %s: %w", path, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: adopt listener %s: set non-blocking: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ctlproto: adopt listener %s: %w", path, err)
	}
	return &Listener{path: path, f: f, rc: rc, dev: st.Dev, ino: st.Ino}, nil
}

// lockDir takes an exclusive flock on dir, released by the returned func.
func lockDir(dir string) (func(), error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open directory %s: %w", dir, err)
	}
	for {
		err = unix.Flock(dfd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(dfd)
		return nil, fmt.Errorf("lock directory %s: %w", dir, err)
	}
	return func() { unix.Close(dfd) }, nil // closing releases the lock
}

// clearStale removes a socket file at path that no live process listens on.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ctlproto: listen %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("ctlproto: listen %s: the path exists and is not a socket: remove it or choose another socket path", path)
	}
	pid, err := probe(path)
	switch {
	case err == nil:
		return fmt.Errorf("ctlproto: another bypassd is running on %s (pid %d): stop it or choose another socket path", path, pid)
	case errors.Is(err, unix.EAGAIN):
		return fmt.Errorf("ctlproto: another bypassd is running on %s (busy: its backlog is full): stop it or choose another socket path", path)
	case errors.Is(err, unix.ECONNREFUSED):
		// Nobody listens: a daemon died without removing its socket.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("ctlproto: listen %s: remove stale socket: %w", path, err)
		}
		return nil
	default:
		return fmt.Errorf("ctlproto: listen %s: cannot tell whether a daemon is running there: %w", path, err)
	}
}

// probe connects to path and returns the pid of whoever accepted.
func probe(path string) (int32, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := connectTimeout(fd, &unix.SockaddrUnix{Name: path}, probeTimeout); err != nil {
		return 0, err
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, nil // connected, hence live; the pid is only for the message
	}
	return cred.Pid, nil
}

// Path returns the socket file's path.
func (l *Listener) Path() string { return l.path }

// Accept waits for the next connection. After Close it returns an error
// matching net.ErrClosed. EMFILE/ENFILE are returned (the caller decides
// whether to back off); aborted connections are skipped.
func (l *Listener) Accept() (*Conn, error) {
	var nfd int
	var aerr error
	err := l.rc.Read(func(fd uintptr) bool {
		for {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if aerr != unix.EINTR && aerr != unix.ECONNABORTED {
				return aerr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = aerr
	}
	if err != nil {
		if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			return nil, fmt.Errorf("ctlproto: accept on %s: %w (raise the open-file limit, e.g. LimitNOFILE= in the unit)", l.path, err)
		}
		return nil, fmt.Errorf("ctlproto: accept on %s: %w", l.path, connError(&l.closed, err))
	}
	return NewConn(nfd)
}

// Dup returns a new descriptor of the listening socket (owned by the
// caller), for another process to accept on (live upgrade).
func (l *Listener) Dup() (int, error) {
	var nfd int
	var derr error
	err := l.rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return -1, fmt.Errorf("ctlproto: duplicate listener %s: %w", l.path, err)
	}
	return nfd, nil
}

// SetDeadline makes a pending and any later Accept return
// os.ErrDeadlineExceeded once t passes (zero: no deadline): the daemon
// pauses accepting this way, leaving newcomers in the backlog.
func (l *Listener) SetDeadline(t time.Time) error {
	if err := l.f.SetReadDeadline(t); err != nil {
		return fmt.Errorf("ctlproto: listener %s: set deadline: %w", l.path, err)
	}
	return nil
}

// Abandon closes this Listener's descriptor without removing the socket
// file: after a Dup handed to a new daemon, the socket goes on listening
// there. Later Close calls do nothing.
func (l *Listener) Abandon() {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		_ = l.f.Close()
	})
}

// Close stops accepting (unblocking Accept) and removes the socket file if
// it is still the one this listener created. Established connections are
// not affected. Later calls return the first call's result.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		if err := l.f.Close(); err != nil {
			l.closeErr = fmt.Errorf("ctlproto: close listener %s: %w", l.path, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(l.path, &st); err == nil && st.Dev == l.dev && st.Ino == l.ino {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) && l.closeErr == nil {
				l.closeErr = fmt.Errorf("ctlproto: remove socket %s: %w", l.path, err)
			}
		}
	})
	return l.closeErr
}
