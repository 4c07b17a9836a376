// Command bypass-perf is a sockperf-compatible UDP latency and throughput
// tool whose sockets are bypassd's (package socket, the shim), so the
// kernel-bypass path can be measured with sockperf's own methodology and
// against real sockperf peers.
//
//	bypass-perf [--kernel] MODE [options]
//
// Modes, as sockperf's: server (sr), ping-pong (pp), under-load (ul) and
// throughput (tp), with sockperf's main options (-i -p -m -t --mps
// --reply-every --full-rtt --rate-limit --client_ip --client_port). It
// speaks sockperf's UDP wire protocol (14-byte header: seq, flags, length),
// so either side may be a real sockperf, and prints sockperf 3.7's summary
// lines (avg-latency, percentiles, <MAX>/<MIN>, message rate, bandwidth) so
// scripts that parse sockperf parse it too. --kernel uses ordinary kernel
// sockets instead, for comparison.
//
// It owns the protocol, the test modes, the statistics and their output. It
// does not own the sockets' data path (package socket and the daemon do) and
// does not start bypassd: the daemon must be running (or use --kernel).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

const defaultPort = 11111

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// options is a parsed command line.
type options struct {
	Mode         mode
	Client       clientConfig
	Addr         netip.AddrPort // server: listen address
	Kernel       bool
	DaemonSocket string
	NoColor      bool
	// OneWay (server): report one-way latency from receive timestamps.
	OneWay bool
}

// errUsage marks command-line errors (exit status 2).
var errUsage = errors.New("usage")

// cli runs bypass-perf with args and returns the exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	opts, err := parseArgs(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if !errors.Is(err, errUsage) || err.Error() != errUsage.Error() {
			fmt.Fprintln(stderr, "bypass-perf:", err)
		}
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var tr Transport = kernelTransport{}
	if !opts.Kernel {
		shim, err := openShim(opts.DaemonSocket)
		if err != nil {
			fmt.Fprintf(stderr, "bypass-perf: %v\n(or pass --kernel to use ordinary kernel sockets)\n", err)
			return 1
		}
		tr = shim
	}
	defer tr.Close()
	if err := run(ctx, opts, tr, stdout); err != nil {
		fmt.Fprintln(stderr, "bypass-perf:", err)
		return 1
	}
	return 0
}

// run executes parsed options over tr.
func run(ctx context.Context, opts options, tr Transport, stdout io.Writer) error {
	p := &printer{w: stdout, color: !opts.NoColor}
	p.linef("%s", p.paint(colorMagenta, fmt.Sprintf("== version #3.7-compatible bypass-perf (%s) == ", tr.Name())))
	if opts.Mode == modeServer {
		return runServer(ctx, opts.Addr, opts.OneWay, tr, p)
	}
	return runClient(ctx, opts.Client, tr, p)
}

var modeNames = map[string]mode{
	"server": modeServer, "sr": modeServer,
	"ping-pong": modePingPong, "pp": modePingPong,
	"under-load": modeUnderLoad, "ul": modeUnderLoad,
	"throughput": modeThroughput, "tp": modeThroughput,
}

const usageHead = `usage: bypass-perf [--kernel] [--daemon-socket PATH] MODE [options]

Modes (sockperf's): server (sr), ping-pong (pp), under-load (ul), throughput (tp).
Run "bypass-perf MODE -h" for the options of a mode.
`

// commonFlags are accepted both before the mode and among its options.
type commonFlags struct {
	kernel       bool
	daemonSocket string
	noColor      bool
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.kernel, "kernel", c.kernel, "use ordinary kernel sockets, for comparison")
	fs.StringVar(&c.daemonSocket, "daemon-socket", c.daemonSocket, "bypassd control socket (default: $BYPASSD_SOCKET, else /run/bypassd/bypassd.sock)")
	fs.BoolVar(&c.noColor, "no-color", c.noColor, "leave out sockperf's colour escapes in the summary")
}

// parseArgs parses the command line; usage problems wrap errUsage.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	var common commonFlags
	global := flag.NewFlagSet("bypass-perf", flag.ContinueOnError)
	global.SetOutput(stderr)
	global.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		global.PrintDefaults()
	}
	common.register(global)
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return options{}, err
		}
		return options{}, errUsage
	}
	if global.NArg() == 0 {
		global.Usage()
		return options{}, fmt.Errorf("%w: no mode given", errUsage)
	}
	name := global.Arg(0)
	m, ok := modeNames[name]
	if !ok {
		global.Usage()
		return options{}, fmt.Errorf("%w: unknown mode %q", errUsage, name)
	}
	opts := options{Mode: m}
	fs := flag.NewFlagSet("bypass-perf "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	common.register(fs)

	ip, port := "", defaultPort
	both := func(short, long, usage string, set func(string) error) {
		if short != "" {
			fs.Func(short, usage+" (also --"+long+")", set)
		}
		fs.Func(long, usage, set)
	}
	both("i", "ip", "server address: listen on (server) or send to (clients)", func(s string) error { ip = s; return nil })
	both("p", "port", fmt.Sprintf("server port (default %d)", defaultPort), func(s string) error {
		v, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return fmt.Errorf("port %q: want 0..65535", s)
		}
		port = int(v)
		return nil
	})
	cfg := &opts.Client
	cfg.Mode = m
	cfg.MsgSize = headerSize
	cfg.Duration = time.Second
	cfg.Batch = 1
	cfg.ReplyTimeout = 100 * time.Millisecond
	// sockperf's defaults: ping-pong and throughput as fast as they can,
	// under-load at 10,000 msg/s with a reply every 100th message.
	if m == modeUnderLoad {
		cfg.MPS, cfg.ReplyEvery = 10000, 100
	}
	var clientIP string
	var clientPort int
	if m != modeServer {
		both("m", "msg-size", fmt.Sprintf("message size in bytes, %d..%d (default %d)", headerSize, maxMessage, headerSize), func(s string) error {
			v, err := strconv.Atoi(s)
			if err != nil || v < headerSize || v > maxMessage {
				return fmt.Errorf("message size %q: want %d..%d", s, headerSize, maxMessage)
			}
			cfg.MsgSize = v
			return nil
		})
		both("t", "time", "test duration in seconds (default 1; fractions allowed)", func(s string) error {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || !(v > 0) || v > 36000000 {
				return fmt.Errorf("duration %q: want seconds > 0", s)
			}
			cfg.Duration = time.Duration(v * float64(time.Second))
			return nil
		})
		fs.Func("mps", "messages per second, or max (default: max; under-load 10000)", func(s string) error {
			if s == "max" {
				cfg.MPS = 0
				return nil
			}
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil || v == 0 {
				return fmt.Errorf("--mps %q: want a positive number or max", s)
			}
			cfg.MPS = int(v)
			return nil
		})
		fs.Func("rate-limit", "set SO_MAX_PACING_RATE to this many bytes per second on the socket", func(s string) error {
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil || v == 0 {
				return fmt.Errorf("--rate-limit %q: want bytes per second, 1..%d", s, uint32(math.MaxUint32))
			}
			cfg.RateLimit = uint32(v)
			return nil
		})
		fs.BoolVar(&cfg.SendTime, "send-time", false, fmt.Sprintf("put the send time in each message's payload for a --one-way server (message size at least %d)", minSendTimeSize))
		fs.StringVar(&clientIP, "client_ip", "", "local address to bind the client socket to (default: any)")
		fs.IntVar(&clientPort, "client_port", 0, "local port to bind the client socket to (default: any)")
	}
	if m == modeServer {
		fs.BoolVar(&opts.OneWay, "one-way", false, "report one-way latency: receive timestamp minus the send time of clients run with --send-time (bypassd sockets only)")
	}
	if m == modePingPong || m == modeUnderLoad {
		fs.BoolVar(&cfg.FullRTT, "full-rtt", false, "report round-trip times instead of one-way (RTT/2)")
	}
	if m == modeUnderLoad {
		fs.Func("reply-every", "ask for a reply every N messages (default 100)", func(s string) error {
			v, err := strconv.ParseUint(s, 10, 32)
			if err != nil || v == 0 {
				return fmt.Errorf("--reply-every %q: want a positive number", s)
			}
			cfg.ReplyEvery = v
			return nil
		})
	}
	if m == modePingPong {
		fs.DurationVar(&cfg.ReplyTimeout, "reply-timeout", cfg.ReplyTimeout, "count a message as dropped when its reply takes longer (sockperf waits forever)")
	}
	if m == modeThroughput {
		fs.IntVar(&cfg.Batch, "batch", 1, "messages per send call when the sockets support batches (the shim); sockperf sends one")
	}
	if err := fs.Parse(global.Args()[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return options{}, err
		}
		return options{}, errUsage
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	opts.Kernel, opts.DaemonSocket, opts.NoColor = common.kernel, common.daemonSocket, common.noColor

	var addr netip.Addr
	switch {
	case ip != "":
		a, err := netip.ParseAddr(ip)
		if err != nil || a.Zone() != "" {
			return options{}, fmt.Errorf("%w: -i %q is not an IP address", errUsage, ip)
		}
		addr = a.Unmap()
	case m == modeServer:
		addr = netip.IPv4Unspecified()
	default:
		return options{}, fmt.Errorf("%w: -i ADDRESS (the server to test) is required", errUsage)
	}
	if m == modeServer {
		opts.Addr = netip.AddrPortFrom(addr, uint16(port))
		return opts, nil
	}
	if addr.IsUnspecified() || port == 0 {
		return options{}, fmt.Errorf("%w: cannot send to %v: give the server's address and port", errUsage, netip.AddrPortFrom(addr, uint16(port)))
	}
	cfg.Server = netip.AddrPortFrom(addr, uint16(port))
	if clientPort < 0 || clientPort > 65535 {
		return options{}, fmt.Errorf("%w: --client_port %d: want 0..65535", errUsage, clientPort)
	}
	if clientIP != "" {
		a, err := netip.ParseAddr(clientIP)
		if err != nil || a.Zone() != "" {
			return options{}, fmt.Errorf("%w: --client_ip %q is not an IP address", errUsage, clientIP)
		}
		if a.Unmap().Is4() != addr.Is4() {
			return options{}, fmt.Errorf("%w: --client_ip %v and -i %v are of different families", errUsage, a, addr)
		}
		cfg.Local = netip.AddrPortFrom(a.Unmap(), uint16(clientPort))
	} else {
		cfg.Local = netip.AddrPortFrom(netip.Addr{}, uint16(clientPort))
	}
	if cfg.SendTime && cfg.MsgSize < minSendTimeSize {
		return options{}, fmt.Errorf("%w: --send-time needs messages of at least %d bytes (-m %d)", errUsage, minSendTimeSize, minSendTimeSize)
	}
	if cfg.Batch < 1 || cfg.Batch > 1024 {
		return options{}, fmt.Errorf("%w: --batch %d: want 1..1024", errUsage, cfg.Batch)
	}
	if cfg.ReplyTimeout <= 0 {
		return options{}, fmt.Errorf("%w: --reply-timeout %v: want a positive duration", errUsage, cfg.ReplyTimeout)
	}
	return opts, nil
}
