package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ifaceLock is an flock held on RunDir/<ifname>.lock for as long as the
// daemon uses the interface, with the holder's pid written in the file, so
// that a second daemon is refused with a message naming the first one
// before it even tries the AF_XDP bind (whose EBUSY names nobody). The
// kernel drops the lock when its holder dies, so a crashed daemon's file
// is simply re-taken.
type ifaceLock struct {
	path string
	f    *os.File
}

// lockInterface takes the lock of interface name in dir.
func lockInterface(dir, name string) (*ifaceLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lock interface %s: create %s: %w", name, dir, err)
	}
	path := filepath.Join(dir, name+".lock")
	// A holder that is releasing removes the file after we opened it:
	// then our lock is on a dead inode, so check and retry.
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lock interface %s: open %s: %w", name, path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder := readHolder(f)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("interface %s is in use by another bypassd%s (lock %s): stop it first, or use another interface", name, holder, path)
			}
			return nil, fmt.Errorf("lock interface %s: flock %s: %w", name, path, err)
		}
		var fst, pst unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock interface %s: stat %s: %w", name, path, err)
		}
		if err := unix.Stat(path, &pst); err != nil || pst.Ino != fst.Ino || pst.Dev != fst.Dev {
			f.Close()
			if attempt < 10 {
				continue
			}
			return nil, fmt.Errorf("lock interface %s: %s keeps being replaced: is another bypassd starting and stopping?", name, path)
		}
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock interface %s: write pid to %s: %w", name, path, err)
		}
		return &ifaceLock{path: path, f: f}, nil
	}
}

func readHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}

// release removes the file while still holding the lock (so a newcomer
// either fails on our lock or opens a new file), then unlocks.
func (l *ifaceLock) release() error {
	err := os.Remove(l.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, l.f.Close())
}
