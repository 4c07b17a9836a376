package verbs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoRDMADevice reports an interface without an RDMA device behind it.
var ErrNoRDMADevice = errors.New("no RDMA device")

// Binding names the RDMA device and port behind a network interface.
type Binding struct {
	Interface string `json:"interface"`
	Device    string `json:"device"`
	Port      int    `json:"port"`
}

// Lookup maps a network interface of the calling thread's network namespace
// to its RDMA device and port through sysfs.
func Lookup(ifname string) (Binding, error) {
	return lookupIn("/sys", ifname, ethtoolBusInfo)
}

// lookupIn maps ifname using the sysfs tree at root:
//
//   - the interface's PCI function lists its RDMA devices in
//     class/net/IF/device/infiniband/; when /sys belongs to another network
//     namespace than the calling thread (a thread that entered a namespace
//     without remounting sysfs), class/net lacks the interface, and
//     busInfo (ethtool's bus-info, asked in the thread's namespace) names
//     the PCI function under bus/pci/devices/ instead;
//   - a device's port belongs to the interface when the port's first GID is
//     bound to it (ports/N/gid_attrs/ndevs/0 holds the interface name);
//   - failing that (GID table not populated yet), a one-port device is
//     port 1, and on devices with one PCI function for several ports the
//     interface's dev_port (counted from 0) picks the port.
func lookupIn(root, ifname string, busInfo func(string) (string, error)) (Binding, error) {
	if ifname == "" || strings.ContainsAny(ifname, "/\x00") || ifname == "." || ifname == ".." {
		return Binding{}, fmt.Errorf("interface name %q is not valid", ifname)
	}
	netDir := filepath.Join(root, "class/net", ifname)
	devDir := filepath.Join(netDir, "device")
	if _, err := os.Stat(netDir); err != nil {
		bus, berr := busInfo(ifname)
		if berr != nil {
			return Binding{}, fmt.Errorf("interface %s: not in %s, and ethtool cannot name its device: %w (check `ip link` in this network namespace)",
				ifname, filepath.Join(root, "class/net"), berr)
		}
		if bus == "" || strings.ContainsAny(bus, "/\x00") || bus == "." || bus == ".." {
			return Binding{}, fmt.Errorf("interface %s: %w (a virtual interface: ethtool reports no bus for it)", ifname, ErrNoRDMADevice)
		}
		netDir, devDir = "", filepath.Join(root, "bus/pci/devices", bus)
	}
	ents, err := os.ReadDir(filepath.Join(devDir, "infiniband"))
	if err != nil || len(ents) == 0 {
		return Binding{}, fmt.Errorf("interface %s: %w (nothing in %s: not an RDMA-capable NIC, or its RDMA driver such as mlx5_ib is not loaded)",
			ifname, ErrNoRDMADevice, filepath.Join(devDir, "infiniband"))
	}
	var devs []string
	for _, e := range ents {
		devs = append(devs, e.Name())
	}
	sort.Strings(devs)
	for _, dev := range devs {
		for _, port := range devicePorts(root, dev) {
			b, err := os.ReadFile(filepath.Join(root, "class/infiniband", dev, "ports", strconv.Itoa(port), "gid_attrs/ndevs/0"))
			if err == nil && strings.TrimSpace(string(b)) == ifname {
				return Binding{Interface: ifname, Device: dev, Port: port}, nil
			}
		}
	}
	dev := devs[0]
	ports := devicePorts(root, dev)
	if len(devs) == 1 && len(ports) == 1 {
		return Binding{Interface: ifname, Device: dev, Port: ports[0]}, nil
	}
	if b, err := os.ReadFile(filepath.Join(netDir, "dev_port")); netDir != "" && err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			for _, p := range ports {
				if p == n+1 {
					return Binding{Interface: ifname, Device: dev, Port: p}, nil
				}
			}
		}
	}
	return Binding{}, fmt.Errorf("interface %s: RDMA device(s) %s found but no port is bound to it (check `rdma link` and `ibv_devinfo`)",
		ifname, strings.Join(devs, ", "))
}

// ethtoolBusInfo asks the kernel, in the calling thread's network
// namespace, for the bus address of ifname's device (ETHTOOL_GDRVINFO), e.g.
// "0000:03:00.0"; virtual interfaces have none ("").
func ethtoolBusInfo(ifname string) (string, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("socket for ethtool: %w", err)
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
	if err != nil {
		return "", fmt.Errorf("ethtool driver info of %s: %w", ifname, err)
	}
	return unix.ByteSliceToString(info.Bus_info[:]), nil
}

// devicePorts lists the port numbers of an RDMA device, ascending.
func devicePorts(root, dev string) []int {
	ents, err := os.ReadDir(filepath.Join(root, "class/infiniband", dev, "ports"))
	if err != nil {
		return nil
	}
	var ports []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 && n < 256 {
			ports = append(ports, n)
		}
	}
	sort.Ints(ports)
	return ports
}
