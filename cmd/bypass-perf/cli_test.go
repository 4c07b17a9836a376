package main

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) options {
		t.Helper()
		o, err := parseArgs(args, new(bytes.Buffer))
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return o
	}
	o := parse("--kernel", "ping-pong", "-i", "10.0.0.2", "-p", "12345", "-m", "64", "-t", "3")
	if !o.Kernel || o.Mode != modePingPong || o.Client.Server != netip.MustParseAddrPort("10.0.0.2:12345") ||
		o.Client.MsgSize != 64 || o.Client.Duration != 3*time.Second || o.Client.MPS != 0 {
		t.Errorf("ping-pong: %+v", o)
	}
	// sockperf's long names, --mps=max and the kernel flag after the mode.
	o = parse("pp", "--ip", "10.0.0.2", "--port=7", "--msg-size=1400", "--time", "0.5", "--mps=max", "--full-rtt", "--kernel")
	if !o.Kernel || o.Client.Server.Port() != 7 || o.Client.MsgSize != 1400 || o.Client.Duration != 500*time.Millisecond || !o.Client.FullRTT {
		t.Errorf("long names: %+v", o)
	}
	o = parse("ul", "-i", "fd00::2")
	if o.Mode != modeUnderLoad || o.Client.MPS != 10000 || o.Client.ReplyEvery != 100 || o.Client.MsgSize != headerSize ||
		o.Client.Duration != time.Second || o.Client.Server.Port() != defaultPort {
		t.Errorf("under-load defaults: %+v", o)
	}
	o = parse("under-load", "-i", "10.0.0.2", "--mps", "20000", "--reply-every", "7", "--client_ip", "10.0.0.1", "--client_port", "5000")
	if o.Client.MPS != 20000 || o.Client.ReplyEvery != 7 || o.Client.Local != netip.MustParseAddrPort("10.0.0.1:5000") {
		t.Errorf("under-load: %+v", o)
	}
	o = parse("tp", "-i", "10.0.0.2", "--rate-limit", "125000", "--batch", "32")
	if o.Mode != modeThroughput || o.Client.RateLimit != 125000 || o.Client.Batch != 32 || o.Kernel {
		t.Errorf("throughput: %+v", o)
	}
	o = parse("server")
	if o.Mode != modeServer || o.Addr != netip.MustParseAddrPort("0.0.0.0:11111") {
		t.Errorf("server defaults: %+v", o)
	}
	o = parse("--daemon-socket", "/tmp/x.sock", "sr", "-i", "10.0.0.1", "-p", "2000", "--no-color")
	if o.Addr != netip.MustParseAddrPort("10.0.0.1:2000") || o.DaemonSocket != "/tmp/x.sock" || !o.NoColor {
		t.Errorf("server: %+v", o)
	}
}

func TestParseArgsErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"pp"},                  // no -i
		{"pp", "-i", "0.0.0.0"}, // unspecified server
		{"pp", "-i", "10.0.0.2", "-p", "0"},
		{"pp", "-i", "host.example"},
		{"pp", "-i", "10.0.0.2", "-m", "13"},
		{"pp", "-i", "10.0.0.2", "-m", "65508"},
		{"pp", "-i", "10.0.0.2", "-t", "0"},
		{"pp", "-i", "10.0.0.2", "-t", "-1"},
		{"pp", "-i", "10.0.0.2", "--mps", "0"},
		{"pp", "-i", "10.0.0.2", "--reply-every", "3"}, // under-load only
		{"ul", "-i", "10.0.0.2", "--reply-every", "0"},
		{"tp", "-i", "10.0.0.2", "--full-rtt"},
		{"tp", "-i", "10.0.0.2", "--rate-limit", "0"},
		{"tp", "-i", "10.0.0.2", "--batch", "0"},
		{"pp", "-i", "10.0.0.2", "--client_ip", "fd00::1"},
		{"pp", "-i", "10.0.0.2", "extra"},
		{"sr", "-m", "64"},
		{"sr", "-p", "70000"},
	} {
		var stderr bytes.Buffer
		if _, err := parseArgs(args, &stderr); err == nil || !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	if _, err := parseArgs([]string{"pp", "-h"}, new(bytes.Buffer)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestCLIExitStatus(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if got := cli([]string{"pp"}, &stdout, &stderr); got != 2 {
		t.Errorf("usage error: exit %d", got)
	}
	if !strings.Contains(stderr.String(), "-i ADDRESS") {
		t.Errorf("usage error does not say what is missing: %q", stderr.String())
	}
	stderr.Reset()
	// No daemon at this path: exit 1 with a hint at --kernel.
	if got := cli([]string{"--daemon-socket", t.TempDir() + "/none.sock", "pp", "-i", "127.0.0.1"}, &stdout, &stderr); got != 1 {
		t.Errorf("no daemon: exit %d", got)
	}
	if !strings.Contains(stderr.String(), "--kernel") {
		t.Errorf("no daemon: %q does not mention --kernel", stderr.String())
	}
}
