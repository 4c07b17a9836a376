package daemon

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Which queues of an interface get a ring, and which CPU each engine runs
// on. A NIC spreads its flows over all its receive queues (RSS), so by
// default every receive queue gets a ring; the XDP program sends each frame
// to the ring of the queue that received it, which hands it to the flow's
// home ring (ring/handoff.go).

// expandInterfaces lists the rings to open, one config.Interface (Count 0) per
// queue: every receive queue of an interface given without queues (the
// first limit of them when limit > 0), the given ones otherwise. count
// tells how many receive queues an interface has.
func expandInterfaces(its []config.Interface, limit int, count func(string) (int, error)) ([]config.Interface, error) {
	var out []config.Interface
	seen := map[config.Interface]bool{}
	for _, it := range its {
		first, n := it.Queue, max(it.Count, 1)
		if it.Count == config.AllQueues {
			have, err := count(it.Name)
			if err != nil {
				return nil, fmt.Errorf("interface %s: count its receive queues: %w (name the queues: --interface %s:0-3)", it.Name, err, it.Name)
			}
			n = have - first
			if limit > 0 {
				n = min(n, limit)
			}
			if n < 1 {
				return nil, fmt.Errorf("interface %s: has %d receive queue(s), none from queue %d", it.Name, have, first)
			}
		}
		for q := first; q < first+n; q++ {
			one := config.Interface{Name: it.Name, Queue: q}
			if err := one.Validate(); err != nil {
				return nil, err
			}
			if seen[one] {
				return nil, fmt.Errorf("interface %s: queue %d given twice", it.Name, q)
			}
			seen[one] = true
			out = append(out, one)
		}
	}
	return out, nil
}

// ethtoolChannels is struct ethtool_channels (linux/ethtool.h).
type ethtoolChannels struct {
	cmd                                         uint32
	maxRX, maxTX, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

// ifreqPtr is struct ifreq with its union used as a pointer (ifr_data).
type ifreqPtr struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [unsafe.Sizeof(unix.Ifreq{}) - unix.IFNAMSIZ - unsafe.Sizeof(uintptr(0))]byte
}

// rxQueueCount is how many receive queues ifname has now, in the calling
// thread's namespace: `ethtool -l`'s combined plus RX-only channels, or,
// for a driver without channel information, the kernel's queue count
// (netlink).
func rxQueueCount(nl *netlink.Handle, ifname string) (int, error) {
	if len(ifname) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("invalid interface name %q", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for ethtool: %w", err)
	}
	defer unix.Close(fd)
	ch := &ethtoolChannels{cmd: unix.ETHTOOL_GCHANNELS}
	var ifr ifreqPtr
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(ch)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(ch)
	if errno == 0 && ch.rxCount+ch.combinedCount > 0 {
		return int(ch.rxCount + ch.combinedCount), nil
	}
	link, err := nl.LinkByName(ifname)
	if err != nil {
		return 0, fmt.Errorf("no interface %q in this network namespace: %w", ifname, err)
	}
	if n := link.Attrs().NumRxQueues; n > 0 {
		return n, nil
	}
	return 1, nil
}

// engineCPUs gives each ring's engine its CPUs: with --cpus the k-th ring
// runs on the k-th CPU of the list (wrapping); without, on the CPUs its
// queue's interrupt is affine to where /proc/interrupts names the queue,
// else spread over the CPUs the daemon may use, one per ring. A single
// ring without --cpus is not pinned (as before multi-queue support): the
// scheduler places it next to its clients.
func engineCPUs(its []config.Interface, cpus []int, bus func(string) string) [][]int {
	out := make([][]int, len(its))
	if len(cpus) > 0 {
		for k := range its {
			out[k] = []int{cpus[k%len(cpus)]}
		}
		return out
	}
	if len(its) < 2 {
		return out
	}
	irqs := queueIRQs()
	var allowed unix.CPUSet
	_ = unix.SchedGetaffinity(0, &allowed)
	var free []int
	for c := 0; c < len(allowed)*64; c++ {
		if allowed.IsSet(c) {
			free = append(free, c)
		}
	}
	for k, it := range its {
		if irq, ok := findQueueIRQ(irqs, it.Name, it.Queue, bus(it.Name)); ok {
			if set := irqAffinity(irq); len(set) > 0 {
				out[k] = set
				continue
			}
		}
		if len(free) > 0 {
			out[k] = []int{free[k%len(free)]}
		}
	}
	return out
}

// queueIRQs reads /proc/interrupts: interrupt number → its name (the last
// field).
func queueIRQs() map[int]string {
	f, err := os.Open("/proc/interrupts")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[int]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(fields[0], ":"))
		if err != nil {
			continue
		}
		out[n] = fields[len(fields)-1]
	}
	return out
}

// findQueueIRQ finds the interrupt of an interface's queue by the names
// drivers give them: "<if>-TxRx-<q>" (i40e, ice, ixgbe, igb), "<if>-rx-<q>",
// "<if>-<q>" (bnxt, ena-style), "<if>-fp-<q>" (qede), and
// "mlx5_comp<q>@pci:<bus>" (mlx5, by PCI address).
func findQueueIRQ(irqs map[int]string, ifname string, q int, bus string) (int, bool) {
	qs := strconv.Itoa(q)
	want := []string{ifname + "-TxRx-" + qs, ifname + "-rx-" + qs, ifname + "-" + qs, ifname + "-fp-" + qs}
	if bus != "" {
		want = append(want, "mlx5_comp"+qs+"@pci:"+bus)
	}
	for irq, name := range irqs {
		for _, w := range want {
			if name == w || strings.HasSuffix(name, "-"+w) {
				return irq, true
			}
		}
	}
	return 0, false
}

// irqAffinity reads /proc/irq/N/smp_affinity_list.
func irqAffinity(irq int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/irq/%d/smp_affinity_list", irq))
	if err != nil {
		return nil
	}
	cpus, err := config.ParseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return nil
	}
	return cpus
}
