package qp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// IfaceKey names an interface across network namespaces: the namespace's
// device and inode, and the interface index. What is shared by the rings of
// one interface in a process (the afxdp provider's XDP program, the ring
// engine's group for handing frames between queues) is keyed by it.
type IfaceKey struct {
	NSDev, NSIno uint64
	Ifindex      int
}

// IfaceKeyOf keys interface ifindex of the calling thread's network
// namespace.
func IfaceKeyOf(ifindex int) (IfaceKey, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return IfaceKey{}, fmt.Errorf("stat network namespace: %w", err)
	}
	return IfaceKey{NSDev: st.Dev, NSIno: st.Ino, Ifindex: ifindex}, nil
}
