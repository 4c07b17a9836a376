package config

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/stats"
)

// defaultMetricsAddr is where /metrics is served unless configured: the
// loopback only, so nothing is exposed by default.
const defaultMetricsAddr = "127.0.0.1:9465"

// Options is everything the command line, the environment and the config
// file decided: the daemon's Config and what only the command uses.
type Options struct {
	Config    Config
	LogLevel  zapcore.Level
	LogFormat string
	// ShowVersion: print the version and exit (--version).
	ShowVersion bool
	// Takeover: replace the daemon running on the socket (live upgrade).
	Takeover bool
}

// setting is one option: a long flag (also its config-file key), maybe a
// short flag, and its environment variable.
type setting struct {
	name, short, env string
	def              string // as shown in --help
	arg              string // argument placeholder in --help
	usage            string
	// multi settings may be given several times (values accumulate); in
	// the environment and the config file they are comma-separated.
	multi bool
	apply func(o *Options, v string) error
}

// envName derives a setting's environment variable (VMA habit: one
// BYPASSD_* variable per knob).
func envName(flag string) string {
	return "BYPASSD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

var settings = []setting{
	{name: "interface", short: "i", env: "BYPASSD_INTERFACES", arg: "IFACE[:Q[-Q]]", def: "(required)", multi: true,
		usage: "interface to accelerate, a ring per receive queue (IFACE: every queue, IFACE:2 one, IFACE:0-3 a range); repeat for more (env: comma-separated)",
		apply: func(o *Options, v string) error {
			it, err := ParseInterface(v)
			if err != nil {
				return err
			}
			o.Config.Interfaces = append(o.Config.Interfaces, it)
			return nil
		}},
	{name: "socket", arg: "PATH", def: ctlproto.DefaultPath,
		usage: "control socket clients connect to",
		apply: func(o *Options, v string) error { o.Config.SocketPath = v; return nil }},
	{name: "socket-mode", arg: "MODE", def: "0660",
		usage: "permission bits of the control socket (octal)",
		apply: func(o *Options, v string) error {
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o777 {
				return fmt.Errorf("%q is not an octal mode 0..0777 (e.g. 0660)", v)
			}
			if m == 0 {
				return errors.New("mode 0 would lock everybody out (use e.g. 0600)")
			}
			o.Config.SocketMode = os.FileMode(m)
			return nil
		}},
	{name: "socket-group", arg: "NAME|GID", def: "(the daemon's group)",
		usage: "group of the control socket: its members may use bypassd",
		apply: func(o *Options, v string) error { o.Config.SocketGroup = v; return nil }},
	{name: "stats-dir", arg: "DIR", def: DefaultStatsDir,
		usage: "directory of per-process stats files",
		apply: func(o *Options, v string) error { o.Config.StatsDir = v; return nil }},
	{name: "run-dir", arg: "DIR", def: DefaultRunDir,
		usage: "directory of the per-interface lock files",
		apply: func(o *Options, v string) error { o.Config.RunDir = v; return nil }},
	{name: "rx-poll", arg: "µs", def: "0",
		usage: "how long clients spin on an empty queue before sleeping (-1: forever, 0: never)",
		apply: func(o *Options, v string) (err error) { o.Config.RXPoll, err = parsePoll(v); return err }},
	{name: "engine-poll", arg: "µs", def: "0",
		usage: "how long an idle ring engine spins before sleeping (-1: forever, 0: never)",
		apply: func(o *Options, v string) (err error) { o.Config.EnginePoll, err = parsePoll(v); return err }},
	{name: "queue-bytes", arg: "SIZE", def: "1M",
		usage: "default size of each socket queue, per direction (power of two, 4K..16M)",
		apply: func(o *Options, v string) error {
			n, err := parseSize(v)
			if err != nil {
				return err
			}
			if n > math.MaxInt32 {
				return fmt.Errorf("%s is too large", v)
			}
			o.Config.QueueBytes = int(n)
			return nil
		}},
	{name: "max-sockets", arg: "N", def: strconv.Itoa(DefaultMaxSockets),
		usage: "most sockets one client connection may open",
		apply: func(o *Options, v string) (err error) { o.Config.MaxSockets, err = parseCount(v); return err }},
	{name: "max-queue-memory", arg: "SIZE", def: "32G",
		usage: "queue memory (address space of its session memfd) one client connection may use",
		apply: func(o *Options, v string) error {
			n, err := parseSize(v)
			o.Config.MaxQueueMemory = n
			return err
		}},
	{name: "max-flows", arg: "N", def: strconv.Itoa(DefaultMaxFlows),
		usage: "capacity of each interface's flow steering map (binds beyond it fail with ENOSPC)",
		apply: func(o *Options, v string) (err error) { o.Config.MaxFlows, err = parseCount(v); return err }},
	{name: "frames", arg: "N", def: strconv.Itoa(DefaultFrames),
		usage: "UMEM frames per ring (power of two, at least 64)",
		apply: func(o *Options, v string) (err error) { o.Config.Frames, err = parseCount(v); return err }},
	{name: "frame-size", arg: "BYTES", def: "auto",
		usage: "ring buffer size: 2048 or 4096 (auto: 2048 up to MTU 1774, else 4096; MTUs over 3822 use multi-buffer chains)",
		apply: func(o *Options, v string) (err error) {
			if v == "auto" {
				o.Config.FrameSize = 0
				return nil
			}
			o.Config.FrameSize, err = strconv.Atoi(v)
			if err == nil && o.Config.FrameSize != 2048 && o.Config.FrameSize != 4096 {
				err = fmt.Errorf("%s: use 2048, 4096 or auto", v)
			}
			return err
		}},
	{name: "provider", arg: "NAME", def: ProviderAuto,
		usage: "ring provider: auto (verbs on an RDMA port when built with -tags verbs, else afxdp), afxdp, verbs or tap",
		apply: func(o *Options, v string) error { o.Config.Provider = v; return nil }},
	{name: "tcp-congestion", arg: "ALGO", def: "cubic",
		usage: "TCP congestion control of the rings' TCP stacks: cubic or reno",
		apply: func(o *Options, v string) error { o.Config.TCPCongestion = v; return nil }},
	{name: "tcp-quickack-threshold", env: "BYPASSD_TCP_QUICKACK_THRESHOLD", arg: "BYTES", def: "0 (off)",
		usage: "with TCP_QUICKACK on, segments with more payload than this are acknowledged the delayed way (VMA's threshold)",
		apply: func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 65535 {
				return fmt.Errorf("want a byte count from 0 (off) to 65535")
			}
			o.Config.TCPQuickAckThreshold = n
			return nil
		}},
	{name: "fallback", arg: "MODE", def: "auto",
		usage: "when a ring's fast path is unavailable or lost: auto (TAP path until it returns), tap (TAP path only) or none",
		apply: func(o *Options, v string) error {
			_, err := ring.ParseFallback(v)
			o.Config.Fallback = v
			return err
		}},
	{name: "xdp-mode", arg: "MODE", def: "auto",
		usage: "XDP attach mode: auto (native, else generic), native or generic",
		apply: func(o *Options, v string) error {
			m, ok := map[string]bpf.AttachMode{"auto": bpf.ModeAuto, "native": bpf.ModeNative, "generic": bpf.ModeGeneric}[v]
			if !ok {
				return fmt.Errorf("%q: want auto, native or generic", v)
			}
			o.Config.XDPMode = m
			return nil
		}},
	{name: "hw-ts-conversion", arg: "MODE", def: "3",
		usage: "hardware timestamp conversion: 0 disable, 1 raw, 2 best, 3 sync to system, 4 ptp (lowered to what every interface supports)",
		apply: func(o *Options, v string) error {
			m, err := tsconv.ParseMode(v)
			o.Config.HWTSConversion = &m
			return err
		}},
	{name: "queues", arg: "N", def: "0 (every queue)",
		usage: "serve at most the first N receive queues of an interface given without queues",
		apply: func(o *Options, v string) (err error) { o.Config.Queues, err = parseCount(v); return err }},
	{name: "cpus", arg: "LIST", def: "(each queue's IRQ CPUs, else spread; one ring: no pinning)",
		usage: "CPUs the ring engine threads run on, the k-th ring on the k-th CPU (wrapping), e.g. 2,3 or 2-5",
		apply: func(o *Options, v string) (err error) { o.Config.CPUs, err = ParseCPUList(v); return err }},
	{name: "dev-mem-tx", env: "BYPASSD_RING_DEV_MEM_TX", arg: "SIZE", def: "0 (off)",
		usage: "device memory each ring stages egress frames in (rounded up to 64 bytes; 0: off)",
		apply: func(o *Options, v string) (err error) { o.Config.DevMemTX, err = parseDevMem(v); return err }},
	{name: "dev-mem-max", arg: "SIZE", def: "256K",
		usage: "device memory one interface has: --dev-mem-tx times its rings must fit",
		apply: func(o *Options, v string) error {
			n, err := parseSize(v)
			if err == nil && n > math.MaxInt32 {
				err = fmt.Errorf("%s is too large", v)
			}
			o.Config.DevMemMax = int(n)
			return err
		}},
	{name: "dev-mem-inline", arg: "BYTES", def: "204",
		usage: "frames of at most this many bytes are never staged (0: stage every frame)",
		apply: func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > math.MaxUint16 {
				return fmt.Errorf("want a byte count from 0 to %d", math.MaxUint16)
			}
			o.Config.DevMemInline = n
			if n == 0 {
				o.Config.DevMemInline = -1 // the daemon's "0": every frame is a candidate
			}
			return nil
		}},
	{name: "qos-file", arg: "PATH", def: "(none: defaults)",
		usage: "JSON file with the traffic-class state of interfaces (tsa, tcbw, ratelimit, prio_tc, trust, ...; see docs/configuration.md); bypassctl qos changes are saved to it",
		apply: func(o *Options, v string) (err error) {
			o.Config.QoSPath = v
			o.Config.QoS, err = LoadQoSFile(v)
			return err
		}},
	{name: "traffic-class", arg: "TOS", def: "-1 (off)",
		usage: "force this ToS byte (DSCP × 4 + ECN, 0..255) on every datagram sent, whatever its socket asked; -1: off",
		apply: func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			switch {
			case err != nil || n < -1 || n > 255:
				return fmt.Errorf("%q: want a ToS byte 0..255 (DSCP × 4, e.g. 96 for DSCP 24) or -1 for off", v)
			case n == -1:
				o.Config.TrafficClass = nil
			default:
				tc := uint8(n)
				o.Config.TrafficClass = &tc
			}
			return nil
		}},
	{name: "ttl", arg: "N", def: "0 (off)",
		usage: "force this TTL / hop limit (1..255) on every unicast datagram sent; 0: off",
		apply: func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 255 {
				return fmt.Errorf("%q: want a TTL 1..255, or 0 for off", v)
			}
			o.Config.TTL = uint8(n)
			return nil
		}},
	{name: "stats-interval", arg: "DURATION", def: "100ms",
		usage: "how often the stats files bypass-stats reads are rewritten (0: no stats files)",
		apply: func(o *Options, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil && v == "0" {
				d, err = 0, nil
			}
			switch {
			case err != nil || d < 0:
				return fmt.Errorf("want a duration such as 100ms or 1s (0: no stats files)")
			case d == 0:
				o.Config.StatsInterval = -1
			case d < time.Millisecond:
				return fmt.Errorf("at least 1ms")
			default:
				o.Config.StatsInterval = d
			}
			return nil
		}},
	{name: "metrics-addr", arg: "HOST:PORT", def: defaultMetricsAddr,
		usage: "where Prometheus scrapes /metrics (empty or off: not served)",
		apply: func(o *Options, v string) error {
			if v == "off" {
				v = ""
			}
			o.Config.MetricsAddr = v
			return nil
		}},
	{name: "metrics-max-clients", arg: "N", def: strconv.Itoa(stats.DefaultMaxClients),
		usage: "client processes with metrics series of their own; the rest are summed as pid=\"other\"",
		apply: func(o *Options, v string) (err error) { o.Config.MetricsMaxClients, err = parseCount(v); return err }},
	{name: "log-level", arg: "LEVEL", def: "info",
		usage: "debug, info, warn or error",
		apply: func(o *Options, v string) error {
			switch v {
			case "debug", "info", "warn", "error":
			default:
				return fmt.Errorf("%q: want debug, info, warn or error", v)
			}
			return o.LogLevel.Set(v)
		}},
	{name: "log-format", arg: "FORMAT", def: "json",
		usage: "json or console",
		apply: func(o *Options, v string) error {
			if v != "json" && v != "console" {
				return fmt.Errorf("%q: want json or console", v)
			}
			o.LogFormat = v
			return nil
		}},
}

func init() {
	for i := range settings {
		if settings[i].env == "" {
			settings[i].env = envName(settings[i].name)
		}
	}
}

// usageError is a mistake in the command line, environment or config file
// (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// value is one raw value and where it came from, for error messages.
type value struct {
	v, from string
}

// Parse combines the sources with precedence flag > environment >
// config file > default. It returns flag.ErrHelp for --help.
func Parse(args []string, getenv func(string) string) (*Options, error) {
	o := &Options{LogLevel: zapcore.InfoLevel, LogFormat: "json"}
	o.Config.MetricsAddr = defaultMetricsAddr
	fs := flag.NewFlagSet("bypassd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fromFlags := map[string][]value{}
	for _, s := range settings {
		s := s
		add := func(v string) error {
			if !s.multi && len(fromFlags[s.name]) > 0 {
				return fmt.Errorf("given twice")
			}
			fromFlags[s.name] = append(fromFlags[s.name], value{v, "--" + s.name})
			return nil
		}
		fs.Func(s.name, s.usage, add)
		if s.short != "" {
			fs.Func(s.short, s.usage, add)
		}
	}
	configPath := fs.String("config", "", "")
	fs.BoolVar(&o.ShowVersion, "version", false, "")
	fs.BoolVar(&o.Takeover, "takeover", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: "); ok {
			name = strings.TrimLeft(name, "-")
			if len(name) > 1 {
				name = "-" + name
			}
			return nil, usagef("unknown option -%s", name)
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q (options start with --)", fs.Arg(0))
	}
	if o.ShowVersion {
		return o, nil
	}
	path := *configPath
	if path == "" {
		path = getenv("BYPASSD_CONFIG")
	}
	var fromFile map[string][]value
	if path != "" {
		var err error
		if fromFile, err = readConfigFile(path); err != nil {
			return nil, err
		}
	}
	for _, s := range settings {
		vals := fromFlags[s.name]
		if len(vals) == 0 {
			if env := getenv(s.env); env != "" {
				vals = splitValue(s, value{env, s.env})
			}
		}
		if len(vals) == 0 {
			for _, fv := range fromFile[s.name] {
				vals = append(vals, splitValue(s, fv)...)
			}
		}
		for _, v := range vals {
			if err := s.apply(o, v.v); err != nil {
				return nil, usagef("%s %q: %v", v.from, v.v, err)
			}
		}
	}
	if err := o.Config.Validate(); err != nil {
		return nil, usageError{err}
	}
	return o, nil
}

// splitValue splits a multi setting's comma-separated value.
func splitValue(s setting, v value) []value {
	if !s.multi {
		return []value{v}
	}
	var out []value
	for _, part := range strings.Split(v.v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, value{part, v.from})
		}
	}
	return out
}

// readConfigFile reads `key = value` lines (keys are the long flag names;
// # starts a comment).
func readConfigFile(path string) (map[string][]value, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("config file: %v", err)
	}
	defer f.Close()
	out := map[string][]value{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		where := fmt.Sprintf("%s:%d", path, n)
		if !ok || key == "" {
			return nil, usagef("%s: want `key = value`, got %q", where, line)
		}
		i := slices.IndexFunc(settings, func(s setting) bool { return s.name == key })
		if i < 0 {
			return nil, usagef("%s: unknown setting %q (settings are the long option names, e.g. interface, socket, rx-poll)", where, key)
		}
		if !settings[i].multi && len(out[key]) > 0 {
			return nil, usagef("%s: %s given twice (first at %s)", where, key, out[key][0].from)
		}
		out[key] = append(out[key], value{val, where})
	}
	if err := sc.Err(); err != nil {
		return nil, usagef("config file %s: %v", path, err)
	}
	return out, nil
}

// parsePoll reads microseconds: -1 (forever) or a non-negative count.
func parsePoll(v string) (time.Duration, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < -1 {
		return 0, fmt.Errorf("want microseconds: -1 (spin forever), 0 (never spin) or a positive number")
	}
	if n < 0 {
		return -1, nil
	}
	return time.Duration(n) * time.Microsecond, nil
}

func parseCount(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive number")
	}
	return n, nil
}

// parseSize reads bytes with an optional binary suffix: K/KiB, M/MiB, G/GiB.
func parseSize(v string) (int64, error) {
	s := strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("want a size in bytes, optionally with K, M or G (binary), e.g. 1M")
	}
	return n * mult, nil
}

// parseDevMem reads a device memory size: 0 or a size as parseSize reads it.
func parseDevMem(v string) (int, error) {
	if strings.TrimSpace(v) == "0" {
		return 0, nil
	}
	n, err := parseSize(v)
	if err != nil {
		return 0, fmt.Errorf("want 0 or a size in bytes, optionally with K or M (binary), e.g. 64K")
	}
	if n > math.MaxInt32 {
		return 0, fmt.Errorf("%s is too large", v)
	}
	return int(n), nil
}

// PrintUsage writes --help.
func PrintUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: bypassd --interface IFACE[:Q[-Q]] [options]

bypassd owns an AF_XDP ring on every receive queue of the given interfaces
(or the queues named) and serves
applications that use its socket library over a Unix control socket.

Options (each also an environment variable and a config-file key;
precedence: option > environment > config file > default):
`)
	for _, s := range settings {
		name := "--" + s.name
		if s.short != "" {
			name = "-" + s.short + ", " + name
		}
		fmt.Fprintf(w, "  %-30s %s\n", name+" "+s.arg, s.usage)
		fmt.Fprintf(w, "  %-30s default %s; env %s\n", "", s.def, s.env)
	}
	fmt.Fprintf(w, "  %-30s %s\n", "--config FILE", "read `key = value` lines (keys: the option names above); env BYPASSD_CONFIG")
	fmt.Fprintf(w, "  %-30s %s\n", "--takeover", "replace the bypassd running on the socket without closing its clients' sockets (live upgrade; same options)")
	fmt.Fprintf(w, "  %-30s %s\n", "--version", "print the version and exit")
	fmt.Fprint(w, `
SIGTERM or SIGINT shuts down gracefully (clients are told, rings closed,
XDP detached, files removed); a second signal exits at once. A daemon that
handed over to a --takeover successor exits 0 without touching what it
handed over.
`)
}
