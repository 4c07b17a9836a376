package ring

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// homeNS identifies the network namespace the process started in (package
// initialization runs on the main thread before any goroutine can have
// switched a thread elsewhere). /proc/self/ns/net would not do: it is the
// main thread's current namespace, and Go may run a goroutine that entered
// another namespace on that thread.
var homeNS = func() (st unix.Stat_t) {
	_ = unix.Stat("/proc/thread-self/ns/net", &st)
	return st
}()

// callerNS returns the calling thread's network namespace when it is not
// the process's, and netns.None() when it is: then nothing needs setns(2)
// (and so CAP_SYS_ADMIN) to reach the namespace later.
func callerNS() (netns.NsHandle, error) {
	var thread unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &thread); err != nil {
		return netns.None(), fmt.Errorf("stat network namespace: %w", err)
	}
	if homeNS.Ino != 0 && homeNS.Dev == thread.Dev && homeNS.Ino == thread.Ino {
		return netns.None(), nil
	}
	ns, err := netns.Get()
	if err != nil {
		return netns.None(), fmt.Errorf("open the calling thread's network namespace: %w", err)
	}
	return ns, nil
}

// netlinkHandle returns a netlink handle for ns (netns.None(): the current
// one, without entering it).
func netlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	if !ns.IsOpen() {
		return netlink.NewHandle()
	}
	return netlink.NewHandleAt(ns)
}
