package fdpark

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestParkSockets parks more bound sockets than one table holds: they stay
// bound (the port is taken) without a descriptor each, come back as
// descriptors of the same socket, and go when dropped.
func TestParkSockets(t *testing.T) {
	p, err := New(16)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer p.Close()
	before := openFDs(t)
	const n = 40
	ports := make([]int, n)
	slots := make([]Slot, n)
	for i := range n {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		sa, _ := unix.Getsockname(fd)
		ports[i] = sa.(*unix.SockaddrInet4).Port
		if slots[i], err = p.Put(fd); err != nil {
			t.Fatal(err)
		}
	}
	if p.Len() != n || p.Tables() != 3 {
		t.Fatalf("%d parked in %d tables, want %d in 3", p.Len(), p.Tables(), n)
	}
	if grew := openFDs(t) - before; grew != 2 {
		t.Fatalf("descriptors grew by %d for %d parked sockets in 3 tables (want 2: the new tables)", grew, n)
	}
	// Parked sockets keep their ports.
	for _, port := range ports[:3] {
		if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err == nil {
			c.Close()
			t.Fatalf("port %d free while its socket is parked", port)
		}
	}
	// Get gives the same socket back.
	fd, err := p.Get(slots[33])
	if err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil || sa.(*unix.SockaddrInet4).Port != ports[33] {
		t.Fatalf("descriptor of slot 33: %v %v, want port %d", sa, err, ports[33])
	}
	unix.Close(fd)
	// Dropped: the port is free, the slot is reused.
	p.Drop(slots[5])
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: ports[5]})
	if err != nil {
		t.Fatalf("port %d still taken after Drop: %v", ports[5], err)
	}
	c.Close()
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	s, err := p.Put(efd)
	if err != nil || s != slots[5] {
		t.Fatalf("Put after Drop: slot %d %v, want %d", s, err, slots[5])
	}
	if _, err := p.Get(Slot(1000)); err == nil {
		t.Fatal("Get of a slot that does not exist succeeded")
	}
	p.Close()
	if now := openFDs(t); now != before-1 {
		t.Fatalf("%d descriptors after Close, want %d", now, before-1)
	}
}
