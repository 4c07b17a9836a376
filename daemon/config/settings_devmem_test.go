package config

import (
	"strings"
	"testing"
)

func TestDevMemOptions(t *testing.T) {
	o, err := Parse([]string{"-i", "eth1"}, env(nil))
	if err != nil || o.Config.DevMemTX != 0 || o.Config.DevMemMax != 0 || o.Config.DevMemInline != 0 {
		t.Fatalf("defaults: tx %d max %d inline %d, %v", o.Config.DevMemTX, o.Config.DevMemMax, o.Config.DevMemInline, err)
	}
	o, err = Parse([]string{"-i", "eth1", "--dev-mem-tx", "64K", "--dev-mem-max", "1M", "--dev-mem-inline", "0"}, env(nil))
	if err != nil || o.Config.DevMemTX != 64<<10 || o.Config.DevMemMax != 1<<20 || o.Config.DevMemInline != -1 {
		t.Fatalf("flags: tx %d max %d inline %d, %v", o.Config.DevMemTX, o.Config.DevMemMax, o.Config.DevMemInline, err)
	}
	// The VMA-style variable, and a config file.
	o, err = Parse([]string{"-i", "eth1"}, env(map[string]string{"BYPASSD_RING_DEV_MEM_TX": "1000", "BYPASSD_DEV_MEM_INLINE": "300"}))
	if err != nil || o.Config.DevMemTX != 1000 || o.Config.DevMemInline != 300 {
		t.Fatalf("environment: tx %d inline %d, %v", o.Config.DevMemTX, o.Config.DevMemInline, err)
	}
	o, err = Parse([]string{"--config", writeConfig(t, "interface = eth1\ndev-mem-tx = 0\ndev-mem-max = 512K\n")}, env(nil))
	if err != nil || o.Config.DevMemTX != 0 || o.Config.DevMemMax != 512<<10 {
		t.Fatalf("config file: tx %d max %d, %v", o.Config.DevMemTX, o.Config.DevMemMax, err)
	}
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--dev-mem-tx", "-5"}, "want 0 or a size"},
		{[]string{"--dev-mem-max", "0"}, "want a size"},
		{[]string{"--dev-mem-inline", "70000"}, "from 0 to 65535"},
		// Two rings of one interface at 200 KiB each do not fit 256 KiB;
		// the message says what to change.
		{[]string{"-i", "eth1:1", "--dev-mem-tx", "200K"}, "--dev-mem-tx to at most 131072"},
	} {
		_, err := Parse(append([]string{"-i", "eth1"}, tc.args...), env(nil))
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.err)
		}
	}
	// One ring per interface may take the whole cap.
	if _, err := Parse([]string{"-i", "eth1", "-i", "eth2", "--dev-mem-tx", "256K"}, env(nil)); err != nil {
		t.Errorf("256 KiB on each of two interfaces: %v", err)
	}
}
