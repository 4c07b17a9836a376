//go:build verbs

package verbs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// translate wraps an errno that libibverbs returned for op with what it
// usually means on a ConnectX host and what to do about it. The errno stays
// reachable with errors.Is.
func translate(op string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", op, err)
	}
	hint := ""
	switch errno {
	case unix.EPERM, unix.EACCES:
		hint = "raw packet QPs and flow rules need CAP_NET_RAW: run bypassd as root or grant it CAP_NET_RAW"
	case unix.ENOSYS:
		hint = "this kernel offers no RDMA verbs (no /sys/class/infiniband_verbs): load the NIC's RDMA driver (mlx5_ib) and ib_uverbs, or use --provider=afxdp"
	case unix.ENODEV, unix.ENXIO:
		hint = "the RDMA device is gone or not visible in this network namespace (check `ibv_devices` and `rdma link`)"
	case unix.EOPNOTSUPP:
		hint = "the device or its rdma-core provider library lacks this feature (check `ibv_devinfo -v` and that ibverbs-providers is installed)"
	case unix.ENOMEM:
		hint = "the device or locked memory is exhausted: use fewer frames, less device memory, or raise RLIMIT_MEMLOCK (ulimit -l)"
	case unix.EINVAL:
		hint = "the device refused the attributes (queue sizes above its limits, a port that does not exist, or a feature the firmware lacks)"
	case unix.EBUSY:
		hint = "the resource is still in use"
	case unix.EEXIST:
		hint = "an identical flow rule is already installed on this port, perhaps by another process"
	case unix.ENETDOWN:
		hint = "the port is down: check the link (`ip link`, `ibv_devinfo`)"
	}
	if hint == "" {
		return fmt.Errorf("%s: %w", op, errno)
	}
	return fmt.Errorf("%s: %w (%s)", op, errno, hint)
}

// errnoOf turns a libibverbs return value (0 or an errno) into an error.
func errnoOf(rc int) error {
	if rc == 0 {
		return nil
	}
	if rc < 0 {
		rc = -rc
	}
	return unix.Errno(rc)
}
