package config

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bypassd.conf")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOptionsAll(t *testing.T) {
	o, err := Parse([]string{
		"-i", "eth1", "--interface", "eth2:3", "-i", "eth3:0-3", "--queues", "2", "--socket", "/tmp/x.sock", "--socket-mode", "0600",
		"--socket-group", "0", "--stats-dir", "/tmp/st", "--run-dir", "/tmp/run", "--rx-poll", "-1",
		"--engine-poll", "50", "--queue-bytes", "256K", "--max-sockets", "10", "--max-queue-memory", "1GiB", "--max-flows", "1000",
		"--frames", "1024", "--xdp-mode", "generic", "--cpus", "1,3-4", "--log-level", "debug", "--log-format", "console",
	}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	want := []Interface{{Name: "eth1", Count: AllQueues}, {Name: "eth2", Queue: 3, Count: 1}, {Name: "eth3", Count: 4}}
	if !slices.Equal(c.Interfaces, want) || c.Queues != 2 || c.SocketPath != "/tmp/x.sock" || c.SocketMode != 0o600 ||
		c.SocketGroup != "0" || c.StatsDir != "/tmp/st" || c.RunDir != "/tmp/run" || c.RXPoll >= 0 ||
		c.EnginePoll != 50*time.Microsecond || c.QueueBytes != 256<<10 || c.MaxSockets != 10 || c.MaxFlows != 1000 ||
		c.MaxQueueMemory != 1<<30 || c.Frames != 1024 || c.XDPMode != bpf.ModeGeneric ||
		!slices.Equal(c.CPUs, []int{1, 3, 4}) || o.LogLevel != zapcore.DebugLevel || o.LogFormat != "console" {
		t.Errorf("parsed %+v (level %v format %s)", c, o.LogLevel, o.LogFormat)
	}
}

func TestHWTSConversionOption(t *testing.T) {
	o, err := Parse([]string{"-i", "eth1"}, env(nil))
	if err != nil || o.Config.HWTSConversion != nil {
		t.Fatalf("default: %v %v (nil means the daemon's default, 3)", o.Config.HWTSConversion, err)
	}
	for args, want := range map[string]tsconv.Mode{"0": tsconv.ModeDisable, "2": tsconv.ModeBest, "ptp": tsconv.ModePTP} {
		o, err := Parse([]string{"-i", "eth1", "--hw-ts-conversion", args}, env(nil))
		if err != nil || o.Config.HWTSConversion == nil || *o.Config.HWTSConversion != want {
			t.Errorf("--hw-ts-conversion %s: %v %v", args, o.Config.HWTSConversion, err)
		}
	}
	o, err = Parse(nil, env(map[string]string{"BYPASSD_INTERFACES": "eth1", "BYPASSD_HW_TS_CONVERSION": "1"}))
	if err != nil || o.Config.HWTSConversion == nil || *o.Config.HWTSConversion != tsconv.ModeRaw {
		t.Errorf("BYPASSD_HW_TS_CONVERSION=1: %v %v", o.Config.HWTSConversion, err)
	}
}

func TestStatsAndMetricsOptions(t *testing.T) {
	o, err := Parse([]string{"-i", "eth1"}, env(nil))
	if err != nil || o.Config.MetricsAddr != "127.0.0.1:9465" || o.Config.StatsInterval != 0 || o.Config.MetricsMaxClients != 0 {
		t.Fatalf("defaults: %+v %v", o.Config, err)
	}
	o, err = Parse([]string{"-i", "eth1", "--stats-interval", "250ms", "--metrics-addr", "[::1]:9100",
		"--metrics-max-clients", "7"}, env(nil))
	if err != nil || o.Config.StatsInterval != 250*time.Millisecond || o.Config.MetricsAddr != "[::1]:9100" || o.Config.MetricsMaxClients != 7 {
		t.Errorf("set: %+v %v", o.Config, err)
	}
	// 0 turns the stats files off; empty or off turns the metrics off
	// (the environment cannot be empty, hence "off").
	for _, args := range [][]string{{"--stats-interval", "0", "--metrics-addr", ""}, {"--stats-interval", "0s", "--metrics-addr", "off"}} {
		o, err = Parse(append([]string{"-i", "eth1"}, args...), env(nil))
		if err != nil || o.Config.StatsInterval >= 0 || o.Config.MetricsAddr != "" {
			t.Errorf("%v: %+v %v", args, o.Config, err)
		}
	}
	o, err = Parse(nil, env(map[string]string{"BYPASSD_INTERFACES": "eth1", "BYPASSD_METRICS_ADDR": "off", "BYPASSD_STATS_INTERVAL": "1s"}))
	if err != nil || o.Config.MetricsAddr != "" || o.Config.StatsInterval != time.Second {
		t.Errorf("environment: %+v %v", o.Config, err)
	}
	for args, want := range map[string]string{
		"--stats-interval=100":      "duration",
		"--stats-interval=-1s":      "duration",
		"--stats-interval=10us":     "at least 1ms",
		"--metrics-addr=9465":       "HOST:PORT",
		"--metrics-max-clients=0":   "positive number",
		"--metrics-max-clients=few": "positive number",
	} {
		if _, err := Parse([]string{"-i", "eth1", args}, env(nil)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want %q", args, err, want)
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	o, err := Parse([]string{"-i", "eth1"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	// Zero fields mean the daemon's defaults.
	if o.Config.SocketPath != "" || o.Config.QueueBytes != 0 || o.Config.RXPoll != 0 || o.LogLevel != zapcore.InfoLevel || o.LogFormat != "json" {
		t.Errorf("defaults: %+v", o)
	}
}

func TestOptionsPrecedence(t *testing.T) {
	file := writeConfig(t, `
# a comment
interface = eth5, eth6:1
interface = eth7
rx-poll = 10
queue-bytes = 64K
socket = /tmp/file.sock
log-level = warn
`)
	e := map[string]string{"BYPASSD_RX_POLL": "20", "BYPASSD_SOCKET": "/tmp/env.sock"}
	o, err := Parse([]string{"--config", file, "--socket", "/tmp/flag.sock"}, env(e))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Config.Interfaces, []Interface{{Name: "eth5", Count: AllQueues}, {Name: "eth6", Queue: 1, Count: 1}, {Name: "eth7", Count: AllQueues}}) {
		t.Errorf("interfaces from the file: %v", o.Config.Interfaces)
	}
	if o.Config.SocketPath != "/tmp/flag.sock" {
		t.Errorf("flag must beat env and file: %s", o.Config.SocketPath)
	}
	if o.Config.RXPoll != 20*time.Microsecond {
		t.Errorf("env must beat file: %v", o.Config.RXPoll)
	}
	if o.Config.QueueBytes != 64<<10 || o.LogLevel != zapcore.WarnLevel {
		t.Errorf("file values: %d %v", o.Config.QueueBytes, o.LogLevel)
	}
	// Environment interfaces replace the file's; flags replace both.
	e["BYPASSD_INTERFACES"] = "veth1,veth2:0"
	o, err = Parse([]string{"--config", file}, env(e))
	if err != nil || !slices.Equal(o.Config.Interfaces, []Interface{{Name: "veth1", Count: AllQueues}, {Name: "veth2", Count: 1}}) {
		t.Errorf("env interfaces: %v %v", o.Config.Interfaces, err)
	}
	o, err = Parse([]string{"--config", file, "-i", "veth9"}, env(e))
	if err != nil || !slices.Equal(o.Config.Interfaces, []Interface{{Name: "veth9", Count: AllQueues}}) {
		t.Errorf("flag interfaces: %v %v", o.Config.Interfaces, err)
	}
	// BYPASSD_CONFIG names the file when --config does not.
	o, err = Parse(nil, env(map[string]string{"BYPASSD_CONFIG": file}))
	if err != nil || o.Config.SocketPath != "/tmp/file.sock" {
		t.Errorf("BYPASSD_CONFIG: %v %v", o, err)
	}
}

func TestOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		file string
		err  string
	}{
		{args: []string{"--bogus"}, err: "unknown option --bogus"},
		{args: []string{"-x"}, err: "unknown option -x"},
		{args: []string{"-i", "eth1", "extra"}, err: `unexpected argument "extra"`},
		{args: nil, err: "no interface configured"},
		{args: []string{"-i", "eth1:q"}, err: "not a number"},
		{args: []string{"-i", "eth1", "--socket-mode", "999"}, err: "octal mode"},
		{args: []string{"-i", "eth1", "--socket-mode", "0"}, err: "lock everybody out"},
		{args: []string{"-i", "eth1", "--rx-poll", "-2"}, err: "microseconds"},
		{args: []string{"-i", "eth1", "--queue-bytes", "1000"}, err: "power of two"},
		{args: []string{"-i", "eth1", "--queue-bytes", "1X"}, err: "size in bytes"},
		{args: []string{"-i", "eth1", "--max-sockets", "0"}, err: "positive number"},
		{args: []string{"-i", "eth1", "--frames", "100"}, err: "power of two"},
		{args: []string{"-i", "eth1", "--xdp-mode", "fast"}, err: "auto, native or generic"},
		{args: []string{"-i", "eth1", "--cpus", "3-1"}, err: "CPU or range"},
		{args: []string{"-i", "eth1", "--hw-ts-conversion", "5"}, err: "0 (disable), 1 (raw), 2 (best), 3 (sync, the default) or 4 (ptp)"},
		{args: []string{"-i", "eth1", "--log-level", "loud"}, err: "debug, info, warn or error"},
		{args: []string{"-i", "eth1", "--log-format", "xml"}, err: "json or console"},
		{args: []string{"-i", "eth1", "--socket", "a", "--socket", "b"}, err: "given twice"},
		{args: []string{"-i", "eth1", "--socket-group", "no-such-group-bypassd"}, err: "groupadd"},
		{env: map[string]string{"BYPASSD_INTERFACES": "eth1", "BYPASSD_MAX_QUEUE_MEMORY": "lots"}, err: `BYPASSD_MAX_QUEUE_MEMORY "lots"`},
		{args: []string{"--config", "/nonexistent/bypassd.conf"}, err: "no such file"},
		{file: "interface = eth1\nbogus = 1\n", err: `:2: unknown setting "bogus"`},
		{file: "interface eth1\n", err: ":1: want `key = value`"},
		{file: "interface = eth1\nsocket = /a\nsocket = /b\n", err: "socket given twice"},
		{file: "interface = eth1\nframes = many\n", err: `:2 "many": want a positive number`},
	} {
		args := tc.args
		if tc.file != "" {
			args = append(args, "--config", writeConfig(t, tc.file))
		}
		_, err := Parse(args, env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v %v %q: %v; want error containing %q", tc.args, tc.env, tc.file, err, tc.err)
		}
	}
}

func TestParseHelpers(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "4K": 4096, "4KiB": 4096, "1M": 1 << 20, "2 MiB": 2 << 20, "1G": 1 << 30} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0", "-1", "K", "1T", "99999999999G"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
	if got, err := ParseCPUList("0, 2-3,2"); err != nil || !slices.Equal(got, []int{0, 2, 3}) {
		t.Errorf("ParseCPUList = %v, %v", got, err)
	}
	for _, in := range []string{"", "a", "1-", "-1", "2-1"} {
		if _, err := ParseCPUList(in); err == nil {
			t.Errorf("ParseCPUList(%q): no error", in)
		}
	}
	if d, err := parsePoll("-1"); err != nil || d >= 0 {
		t.Errorf("parsePoll(-1) = %v, %v", d, err)
	}
	if envName("max-queue-memory") != "BYPASSD_MAX_QUEUE_MEMORY" {
		t.Error(envName("max-queue-memory"))
	}
}

// Every setting is listed in --help with its environment variable.
func TestUsageListsSettings(t *testing.T) {
	var out bytes.Buffer
	PrintUsage(&out)
	for _, s := range settings {
		if !strings.Contains(out.String(), "--"+s.name) || !strings.Contains(out.String(), s.env) {
			t.Errorf("--help lacks %s / %s", s.name, s.env)
		}
	}
}
