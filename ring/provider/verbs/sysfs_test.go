package verbs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sysfsTree builds a fake /sys with the given files (path → content; a
// trailing slash makes a directory).
func sysfsTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// noBus stands for ethtool on an interface the fake tree does not have.
func noBus(ifname string) (string, error) { return "", errors.New("no such device") }

// A thread in another network namespace than the one /sys was mounted in:
// class/net lacks the interface, ethtool's bus-info finds the PCI function.
func TestLookupThroughBusInfo(t *testing.T) {
	root := sysfsTree(t, map[string]string{
		"bus/pci/devices/0000:03:00.1/infiniband/mlx5_1/": "",
		"class/infiniband/mlx5_1/ports/1/":                "",
	})
	bus := func(ifname string) (string, error) {
		if ifname != "ens1f1" {
			t.Fatalf("bus-info asked for %q", ifname)
		}
		return "0000:03:00.1", nil
	}
	b, err := lookupIn(root, "ens1f1", bus)
	if err != nil || b.Device != "mlx5_1" || b.Port != 1 {
		t.Fatalf("lookup through bus-info: %+v, %v", b, err)
	}
	virtual := func(string) (string, error) { return "", nil }
	if _, err := lookupIn(root, "veth7", virtual); !errors.Is(err, ErrNoRDMADevice) || !strings.Contains(err.Error(), "virtual") {
		t.Fatalf("interface without a bus: %v, want ErrNoRDMADevice", err)
	}
	for _, evil := range []string{"..", "../../etc", "a/b"} {
		if _, err := lookupIn(root, "x", func(string) (string, error) { return evil, nil }); !errors.Is(err, ErrNoRDMADevice) {
			t.Fatalf("bus-info %q: %v", evil, err)
		}
	}
	if _, err := lookupIn(root, "gone0", noBus); err == nil || errors.Is(err, ErrNoRDMADevice) || !strings.Contains(err.Error(), "ip link") {
		t.Fatalf("missing interface: %v", err)
	}
}

func TestLookupByGIDNetdev(t *testing.T) {
	// Two ports of one device (mlx4 style): the GID table says which is ours.
	root := sysfsTree(t, map[string]string{
		"class/net/eth1/device/infiniband/mlx4_0/":          "",
		"class/infiniband/mlx4_0/ports/1/gid_attrs/ndevs/0": "eth0\n",
		"class/infiniband/mlx4_0/ports/2/gid_attrs/ndevs/0": "eth1\n",
	})
	b, err := lookupIn(root, "eth1", noBus)
	if err != nil {
		t.Fatal(err)
	}
	if b != (Binding{Interface: "eth1", Device: "mlx4_0", Port: 2}) {
		t.Fatalf("got %+v, want mlx4_0 port 2", b)
	}
}

func TestLookupSinglePortWithoutGIDs(t *testing.T) {
	root := sysfsTree(t, map[string]string{
		"class/net/ens1f0/device/infiniband/mlx5_0/": "",
		"class/infiniband/mlx5_0/ports/1/":           "",
	})
	b, err := lookupIn(root, "ens1f0", noBus)
	if err != nil {
		t.Fatal(err)
	}
	if b.Device != "mlx5_0" || b.Port != 1 {
		t.Fatalf("got %+v, want mlx5_0 port 1", b)
	}
}

func TestLookupDevPort(t *testing.T) {
	root := sysfsTree(t, map[string]string{
		"class/net/eth3/device/infiniband/mlx4_1/": "",
		"class/net/eth3/dev_port":                  "1\n",
		"class/infiniband/mlx4_1/ports/1/":         "",
		"class/infiniband/mlx4_1/ports/2/":         "",
	})
	b, err := lookupIn(root, "eth3", noBus)
	if err != nil {
		t.Fatal(err)
	}
	if b.Port != 2 {
		t.Fatalf("dev_port 1 gave port %d, want 2", b.Port)
	}
}

func TestLookupNoPortBound(t *testing.T) {
	root := sysfsTree(t, map[string]string{
		"class/net/eth3/device/infiniband/mlx4_1/": "",
		"class/infiniband/mlx4_1/ports/1/":         "",
		"class/infiniband/mlx4_1/ports/2/":         "",
	})
	_, err := lookupIn(root, "eth3", noBus)
	if err == nil || !strings.Contains(err.Error(), "no port is bound") {
		t.Fatalf("err = %v, want a no-port error", err)
	}
}

func TestLookupNoRDMADevice(t *testing.T) {
	root := sysfsTree(t, map[string]string{"class/net/veth0/device/": ""})
	_, err := lookupIn(root, "veth0", noBus)
	if !errors.Is(err, ErrNoRDMADevice) {
		t.Fatalf("err = %v, want ErrNoRDMADevice", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := lookupIn(root, bad, noBus); err == nil {
			t.Fatalf("interface name %q accepted", bad)
		}
	}
}

// The real sysfs: the loopback interface has no RDMA device anywhere.
func TestLookupLoopback(t *testing.T) {
	if _, err := os.Stat("/sys/class/net/lo"); err != nil {
		t.Skipf("no sysfs here: %v", err)
	}
	if _, err := Lookup("lo"); !errors.Is(err, ErrNoRDMADevice) {
		t.Fatalf("Lookup(lo) = %v, want ErrNoRDMADevice", err)
	}
	d := Decide("lo")
	if d.Use || !strings.Contains(d.Reason, "no RDMA device") {
		t.Fatalf("Decide(lo) = %+v, want no verbs because there is no RDMA device", d)
	}
}
