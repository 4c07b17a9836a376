//go:build verbs

package verbs

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// These run the real libibverbs on a host without RDMA devices (like CI's):
// its own error returns must come out as errors that say what to do.
func requireNoDevices(t *testing.T) error {
	t.Helper()
	names, err := cDeviceNames()
	if err == nil && len(names) > 0 {
		t.Skipf("this host has RDMA devices %v: the hardware tests cover it", names)
	}
	return err
}

// checkNoDeviceError asserts the error for opening mlx5_0 on a host whose
// libibverbs said listErr when asked for its devices.
func checkNoDeviceError(t *testing.T, err, listErr error) {
	t.Helper()
	if err == nil {
		t.Fatal("opening a device that does not exist succeeded")
	}
	switch {
	case errors.Is(listErr, unix.ENOSYS):
		// No RDMA in the kernel: ibv_get_device_list fails with ENOSYS.
		if !errors.Is(err, unix.ENOSYS) || !strings.Contains(err.Error(), "ib_uverbs") || !strings.Contains(err.Error(), "mlx5_0") {
			t.Fatalf("err = %v, want ENOSYS naming the device and saying to load ib_uverbs", err)
		}
	case listErr == nil:
		if !errors.Is(err, ErrNoRDMADevice) || !strings.Contains(err.Error(), "devices present: none") {
			t.Fatalf("err = %v, want ErrNoRDMADevice listing no devices", err)
		}
	default:
		if !errors.Is(err, listErr) {
			t.Fatalf("err = %v, want the device list's error %v", err, listErr)
		}
	}
}

func TestOpenWithoutDevice(t *testing.T) {
	listErr := requireNoDevices(t)
	t.Logf("ibv_get_device_list here: %v", listErr)
	_, err := Open(Config{Interface: "lo", Device: "mlx5_0", Port: 1})
	checkNoDeviceError(t, err, listErr)
	if !strings.HasPrefix(err.Error(), "verbs lo/0: ") {
		t.Errorf("error %q does not name the ring", err)
	}
	_, err = Query(Binding{Interface: "lo", Device: "mlx5_0", Port: 1})
	checkNoDeviceError(t, err, listErr)
}

func TestOpenLookupFails(t *testing.T) {
	_, err := Open(Config{Interface: "lo"})
	if !errors.Is(err, ErrNoRDMADevice) {
		t.Fatalf("Open(lo) = %v, want ErrNoRDMADevice from the sysfs lookup", err)
	}
	if _, err := Open(Config{Interface: "lo", Device: "mlx5_0"}); err == nil || !strings.Contains(err.Error(), "ports count from 1") {
		t.Fatalf("port 0 accepted: %v", err)
	}
	if _, err := Open(Config{Interface: "lo", Device: "mlx5_0", Port: 1, Frames: 10}); err == nil || !strings.Contains(err.Error(), "frame count") {
		t.Fatalf("10 frames accepted: %v", err)
	}
	if _, err := Open(Config{Interface: "lo", Device: "mlx5_0", Port: 1, FrameSize: 3000}); err == nil || !strings.Contains(err.Error(), "frame size") {
		t.Fatalf("frame size 3000 accepted: %v", err)
	}
}

// Decide with an interface that sysfs says has an RDMA device, in a binary
// that has the provider: the device query goes to the real libibverbs and
// its failure becomes the reason to stay on afxdp.
func TestDecideDeviceQueryFails(t *testing.T) {
	listErr := requireNoDevices(t)
	root := sysfsTree(t, map[string]string{
		"class/net/eth1/device/infiniband/mlx5_0/": "",
		"class/infiniband/mlx5_0/ports/1/":         "",
	})
	d := decideIn(root, "eth1", noBus)
	if d.Use || d.Binding == nil || d.Caps != nil || !strings.Contains(d.Reason, "mlx5_0 port 1") {
		t.Fatalf("decide = %+v, want no verbs with the device and the reason", d)
	}
	if errors.Is(listErr, unix.ENOSYS) && !strings.Contains(d.Reason, "ib_uverbs") {
		t.Fatalf("reason %q does not carry the translated ENOSYS", d.Reason)
	}
}
