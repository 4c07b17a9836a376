//go:build !verbs

package verbs

import (
	"errors"
	"strings"
	"testing"
)

func TestNotBuilt(t *testing.T) {
	if _, err := Query(Binding{Device: "mlx5_0", Port: 1}); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Query = %v, want ErrNotBuilt", err)
	}
	if !strings.Contains(ErrNotBuilt.Error(), "-tags verbs") || !strings.Contains(ErrNotBuilt.Error(), "libibverbs-dev") {
		t.Fatalf("ErrNotBuilt does not say how to build the provider: %v", ErrNotBuilt)
	}
	root := sysfsTree(t, map[string]string{
		"class/net/eth1/device/infiniband/mlx5_0/": "",
		"class/infiniband/mlx5_0/ports/1/":         "",
	})
	d := decideIn(root, "eth1", noBus)
	if d.Use || d.Binding == nil || d.Binding.Device != "mlx5_0" || !strings.Contains(d.Reason, "-tags verbs") {
		t.Fatalf("decide = %+v, want afxdp with the device named and the build hint", d)
	}
}
