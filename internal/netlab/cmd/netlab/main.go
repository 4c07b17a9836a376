// Command netlab creates and removes bypassd network labs from shell
// scripts (demo, bench). It owns nothing beyond what package netlab
// creates; processes the script starts in a lab must be stopped before
// `netlab down`.
//
//	eval "$(netlab up --name demo --mtu 1500)"   # sets NS_A, NS_B, IF_A, ... IP6_B, MAC_A, MAC_B
//	ip netns exec "$NS_B" sockperf server -i "$IP4_B" &
//	...
//	netlab down --name demo
//	netlab sweep                                 # remove labs of dead test processes
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/bypassd/bypassd/internal/netlab"
)

const usage = `usage:
  netlab up --name NAME [--mtu N] [--rxq N] [--txq N] [--tx-csum] [--static-neigh]
      create namespaces bdlab-NAME-a and bdlab-NAME-b joined by a veth pair and
      print shell assignments (NS_A NS_B IF_A IF_B IP4_A IP4_B IP6_A IP6_B MAC_A MAC_B);
      use: eval "$(netlab up --name NAME)"
  netlab down --name NAME
      delete both namespaces (and the veth); succeeds if they are already gone
  netlab sweep
      delete lab namespaces whose creating process no longer exists
`

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "netlab:", strings.TrimPrefix(err.Error(), "netlab: "))
		os.Exit(1)
	}
}

var errUsage = errors.New("see usage above")

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "up":
		return up(args[1:], stdout, stderr)
	case "down":
		fs := newFlagSet("down", stderr)
		name := fs.String("name", "", "lab name (required)")
		if err := parse(fs, args[1:]); err != nil {
			return err
		}
		if *name == "" {
			return fmt.Errorf("down: --name is required")
		}
		return netlab.Destroy(*name)
	case "sweep":
		fs := newFlagSet("sweep", stderr)
		if err := parse(fs, args[1:]); err != nil {
			return err
		}
		return netlab.Sweep()
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

func up(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("up", stderr)
	var o netlab.Options
	fs.StringVar(&o.Name, "name", "", "lab name (required); namespaces are bdlab-NAME-a/-b")
	fs.IntVar(&o.MTU, "mtu", netlab.DefaultMTU, "MTU of both veth ends")
	fs.IntVar(&o.RxQueues, "rxq", 1, "RX queues per veth end")
	fs.IntVar(&o.TxQueues, "txq", 1, "TX queues per veth end")
	fs.BoolVar(&o.TxChecksum, "tx-csum", false, "keep TX checksum offload on (frames then carry partial checksums)")
	fs.BoolVar(&o.StaticNeigh, "static-neigh", false, "install permanent ARP/ND entries for the peer")
	if err := parse(fs, args); err != nil {
		return err
	}
	if o.Name == "" {
		return fmt.Errorf("up: --name is required")
	}
	p, err := netlab.CreatePair(o)
	if err != nil {
		return err
	}
	// The namespaces must outlive this process: release only our handles.
	if err := p.Release(); err != nil {
		return errors.Join(err, p.Close())
	}
	for _, kv := range [][2]string{
		{"NS_A", p.A.NS.Name}, {"NS_B", p.B.NS.Name},
		{"IF_A", p.A.Name}, {"IF_B", p.B.Name},
		{"IP4_A", p.A.Addr4().String()}, {"IP4_B", p.B.Addr4().String()},
		{"IP6_A", p.A.Addr6().String()}, {"IP6_B", p.B.Addr6().String()},
		{"MAC_A", p.A.MAC.String()}, {"MAC_B", p.B.MAC.String()},
	} {
		// Values are plain tokens; quote anyway so eval is always safe.
		fmt.Fprintf(stdout, "%s='%s'\n", kv[0], kv[1])
	}
	return nil
}
