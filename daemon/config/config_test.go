package config

import (
	"os"
	"strings"
	"testing"

	"github.com/bypassd/bypassd/bpf"
)

func TestParseInterface(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Interface
		err  string
	}{
		{in: "eth1", want: Interface{Name: "eth1", Count: AllQueues}},
		{in: "eth1:3", want: Interface{Name: "eth1", Queue: 3, Count: 1}},
		{in: " veth0:0 ", want: Interface{Name: "veth0", Count: 1}},
		{in: "eth1:0-3", want: Interface{Name: "eth1", Count: 4}},
		{in: "eth1:2-2", want: Interface{Name: "eth1", Queue: 2, Count: 1}},
		{in: "", err: "empty name"},
		{in: ":1", err: "empty name"},
		{in: "eth1:x", err: "not a number"},
		{in: "eth1:-1", err: "not a number or range"},
		{in: "eth1:65536", err: "out of range"},
		{in: "eth1:3-1", err: "not a number or range"},
		{in: "eth1:0-", err: "not a number or range"},
		{in: "a-very-long-interface", err: "not a valid interface name"},
		{in: "eth1:2:3", err: "not a number"},
	} {
		got, err := ParseInterface(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseInterface(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseInterface(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for it, want := range map[Interface]string{{Name: "eth1", Queue: 2}: "eth1:2", {Name: "eth1", Count: AllQueues}: "eth1",
		{Name: "eth1", Queue: 1, Count: 3}: "eth1:1-3", {Name: "eth1", Queue: 2, Count: AllQueues}: "eth1:2-"} {
		if s := it.String(); s != want {
			t.Errorf("String of %#v = %q, want %q", it, s, want)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Interfaces: []Interface{{Name: "eth1"}}}.WithDefaults()
	if c.SocketPath != "/run/bypassd/bypassd.sock" || c.SocketMode != 0o660 || c.RunDir != "/run/bypassd" ||
		c.StatsDir != "/run/bypassd/stats" || c.QueueBytes != 1<<20 || c.MaxSockets != 16384 ||
		c.MaxQueueMemory != 32<<30 || c.Frames != 4096 {
		t.Errorf("defaults: %+v", c)
	}
	r, err := Config{Interfaces: []Interface{{Name: "eth1"}}}.Resolve()
	if err != nil || r.SocketGID != -1 {
		t.Errorf("resolve: gid %d, %v", r.SocketGID, err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Interfaces: []Interface{{Name: "eth1"}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		err  string
	}{
		{"no interface", func(c *Config) { c.Interfaces = nil }, "at least one"},
		{"duplicate", func(c *Config) { c.Interfaces = append(c.Interfaces, Interface{Name: "eth1"}) }, "given twice"},
		{"bad queue", func(c *Config) { c.Interfaces[0].Queue = 1 << 16 }, "out of range"},
		{"bad count", func(c *Config) { c.Interfaces[0].Count = -2 }, "out of range"},
		{"negative queues", func(c *Config) { c.Queues = -1 }, "queues -1"},
		{"relative socket", func(c *Config) { c.SocketPath = "ctl.sock" }, "absolute path"},
		{"mode bits", func(c *Config) { c.SocketMode = os.ModeSetuid | 0o660 }, "permission bits"},
		{"group", func(c *Config) { c.SocketGroup = "no-such-group-bypassd" }, "groupadd"},
		{"rx poll", func(c *Config) { c.RXPoll = 1 << 62 }, "too long"},
		{"queue small", func(c *Config) { c.QueueBytes = 1024 }, "power of two"},
		{"queue odd", func(c *Config) { c.QueueBytes = 5000 }, "power of two"},
		{"queue big", func(c *Config) { c.QueueBytes = 32 << 20 }, "16 MiB"},
		{"max sockets", func(c *Config) { c.MaxSockets = -1 }, "must be 1 to"},
		{"too many sockets", func(c *Config) { c.MaxSockets = 1 << 20 }, "must be 1 to 262144"},
		{"too much memory", func(c *Config) { c.MaxQueueMemory = 1 << 50 }, "64 TiB"},
		{"memory", func(c *Config) { c.MaxQueueMemory = 4096 }, "too small"},
		{"frames", func(c *Config) { c.Frames = 100 }, "power of two"},
		{"xdp mode", func(c *Config) { c.XDPMode = bpf.AttachMode(7) }, "auto, native or generic"},
		{"cpu", func(c *Config) { c.CPUs = []int{-1} }, "not a CPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			c.Interfaces = append([]Interface(nil), ok.Interfaces...)
			tc.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Validate = %v; want error containing %q", err, tc.err)
			}
		})
	}
	// Numeric groups need no lookup.
	c := ok
	c.SocketGroup = "4242"
	if r, err := c.Resolve(); err != nil || r.SocketGID != 4242 {
		t.Errorf("numeric group: %d, %v", r.SocketGID, err)
	}
	c.SocketGroup = "root"
	if r, err := c.Resolve(); err != nil || r.SocketGID != 0 {
		t.Errorf("group root: %d, %v", r.SocketGID, err)
	}
	// Same interface, two queues: fine.
	c = ok
	c.Interfaces = []Interface{{Name: "eth1"}, {Name: "eth1", Queue: 1}}
	if err := c.Validate(); err != nil {
		t.Errorf("two queues: %v", err)
	}
}
