package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

func init() {
	register(command{
		name: "qos", args: "[-i IF]", help: "traffic classes of each interface in mlnx_qos's layout, with per-class counters",
		run: runQoS,
	})
}

func runQoS(o *options, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("bypassctl qos", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	iface := fs.String("i", "", "interface (default: every interface)")
	fs.StringVar(iface, "interface", "", "interface")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("qos: %w (usage: bypassctl qos [-i IF])", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("qos: unexpected %q (usage: bypassctl qos [-i IF])", fs.Arg(0))
	}
	var doc ctldoc.QoSDoc
	if err := query(o, ctldoc.TopicQoS, &doc); err != nil {
		return err
	}
	if *iface != "" {
		var keep []ctldoc.QoSInterface
		for _, it := range doc.Interfaces {
			if it.Interface == *iface {
				keep = append(keep, it)
			}
		}
		if len(keep) == 0 {
			return fmt.Errorf("qos: bypassd does not serve interface %q (bypassctl rings lists what it serves)", *iface)
		}
		doc.Interfaces = keep
	}
	if o.json {
		return printJSON(w, doc)
	}
	for i := range doc.Interfaces {
		if i > 0 {
			fmt.Fprintln(w)
		}
		printQoS(w, &doc.Interfaces[i])
	}
	return nil
}

// printQoS prints one interface as mlnx_qos -i IF does (trust, dscp2prio,
// then per tc: rate limit, algorithm and share, its UPs and the sk_prios
// mapped to each with the ToS they come from), plus what mlnx_qos does not
// have: the port limit, the forced header fields and the counters.
func printQoS(w io.Writer, it *ctldoc.QoSInterface) {
	c := &it.Config
	fmt.Fprintf(w, "Interface: %s (%d ring%s)\n", it.Interface, it.Rings, map[bool]string{true: "s"}[it.Rings != 1])
	fmt.Fprintf(w, "Priority trust state: %s\n", c.Trust)
	fmt.Fprintln(w, "dscp2prio mapping:")
	for p := range qos.NumTC {
		var d []string
		for dscp := 63; dscp >= 0; dscp-- {
			if c.DSCP2Prio[dscp] == uint8(p) {
				d = append(d, fmt.Sprintf("%02d", dscp))
			}
		}
		if len(d) > 0 {
			fmt.Fprintf(w, "\tprio:%d dscp:%s,\n", p, strings.Join(d, ","))
		}
	}
	fmt.Fprintf(w, "Port ratelimit: %s\n", qos.FormatRate(c.MaxRateKbps))
	tclass, ttl := "off", "off"
	if c.TrafficClass >= 0 {
		tclass = fmt.Sprintf("%d (dscp %d)", c.TrafficClass, qos.DSCP(uint8(c.TrafficClass)))
	}
	if c.TTL != 0 {
		ttl = fmt.Sprint(c.TTL)
	}
	fmt.Fprintf(w, "Forced traffic_class: %s, ttl: %s\n", tclass, ttl)
	for tc := range qos.NumTC {
		line := fmt.Sprintf("tc: %d ratelimit: %s, tsa: %s", tc, qos.FormatRate(c.RateKbps[tc]), c.TSA[tc])
		if c.TSA[tc] == qos.ETS {
			line += fmt.Sprintf(", bw: %d%%", c.BW[tc])
		}
		fmt.Fprintln(w, line)
		for up := range qos.NumTC {
			if c.PrioTC[up] != uint8(tc) {
				continue
			}
			fmt.Fprintf(w, "\t up: %d\n", up)
			for sp := range qos.NumSkPrio {
				if c.SkPrioUP[sp] != uint8(up) {
					continue
				}
				if tos, ok := qos.SkPrioTOS(uint8(sp)); ok {
					fmt.Fprintf(w, "\t\t skprio: %d (tos: %d)\n", sp, tos)
				} else {
					fmt.Fprintf(w, "\t\t skprio: %d\n", sp)
				}
			}
		}
		s := it.TC[tc]
		fmt.Fprintf(w, "\t tx: %d pkts, %d bytes, backlog %d bytes, held %d; rx: %d pkts, %d bytes\n",
			s.TXPackets, s.TXBytes, s.TXBacklog, s.TXHeld, s.RXPackets, s.RXBytes)
	}
}
