//go:build verbs

package verbs

import (
	"strings"
	"testing"
)

func TestRecvBufferSize(t *testing.T) {
	for _, tc := range []struct {
		mtu, frameSize, want int
	}{
		{1500, 2048, 2048},
		{1500, 4096, 4096}, // a larger configured size stays
		{2030, 2048, 2048}, // exactly fits
		{2031, 2048, 4096},
		{4200, 2048, 8192},
		{9000, 2048, 16384},
		{16366, 2048, 16384},
	} {
		got, err := RecvBufferSize(tc.mtu, tc.frameSize)
		if err != nil || got != tc.want {
			t.Errorf("RecvBufferSize(%d, %d) = %d, %v; want %d", tc.mtu, tc.frameSize, got, err, tc.want)
		}
	}
	if _, err := RecvBufferSize(16367, 2048); err == nil || !strings.Contains(err.Error(), "MTU 16366") {
		t.Errorf("MTU 16367: %v, want a refusal naming the largest MTU", err)
	}
	c := Config{MTU: 9000}
	if err := c.setDefaults(); err != nil || c.FrameSize != 16384 {
		t.Errorf("Config{MTU: 9000}: frame size %d, %v; want 16384", c.FrameSize, err)
	}
}

func TestCheckPortMTU(t *testing.T) {
	port := func(active int) DeviceCaps { return DeviceCaps{Device: "mlx5_0", Port: 1, ActiveMTU: active} }
	for _, tc := range []struct {
		ifMTU, active int
		ok            bool
	}{
		{1500, 1024, true}, // the RoCE MTU of a 1500 interface
		{9000, 4096, true}, // jumbo: RoCE stops at 4096, raw frames go to 9000
		{4200, 4096, true}, // a RoCE fabric's MTU
		{1500, 0, true},    // unknown active MTU
		{0, 4096, true},    // unknown interface MTU
		{1500, 2048, false},
		{1500, 4096, false},
	} {
		err := CheckPortMTU("eth1", tc.ifMTU, port(tc.active))
		if (err == nil) != tc.ok {
			t.Errorf("interface MTU %d, active MTU %d: %v, want ok=%v", tc.ifMTU, tc.active, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "active MTU") || !strings.Contains(err.Error(), "ip link set eth1 mtu")) {
			t.Errorf("refusal does not say why and what to do: %v", err)
		}
	}
}
