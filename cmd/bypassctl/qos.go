package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

func init() {
	register(command{
		name: "qos", args: "[-i IF [SETTINGS]]", help: "traffic classes in mlnx_qos's layout with per-class counters; with settings (-s, -t, -r, -p, --trust, --dscp2prio, ...: bypassctl qos -h) changes them",
		run: runQoS,
	})
}

// qosSetting is one mlnx_qos-like option of bypassctl qos.
type qosSetting struct {
	names []string
	usage string
	set   func(c *qos.Config, v string) error
}

var qosSettings = []qosSetting{
	{[]string{"s", "tsa"}, "transmission algorithm per tc: strict or ets (e.g. ets,ets,strict)", (*qos.Config).SetTSA},
	{[]string{"t", "tcbw"}, "ETS bandwidth % per tc, summing to 100 over the ETS tcs (e.g. 30,70)", (*qos.Config).SetTCBW},
	{[]string{"r", "ratelimit"}, "rate limit per tc in Gbit/s, or with a unit (100M); 0: unlimited", (*qos.Config).SetRateLimit},
	{[]string{"p", "prio_tc"}, "tc of each user priority 0..7 (e.g. 0,0,0,0,1,1,1,1)", (*qos.Config).SetPrioTC},
	{[]string{"u", "skprio_up"}, "user priority of each socket priority 0..15 (the egress map)", (*qos.Config).SetSkPrioUP},
	{[]string{"trust"}, "what classifies received frames: pcp or dscp", func(c *qos.Config, v string) (err error) {
		c.Trust, err = qos.ParseTrust(v)
		return err
	}},
	{[]string{"dscp2prio"}, "set,DSCP,PRIO or del,DSCP,PRIO (repeatable)", (*qos.Config).SetDSCP2Prio},
	{[]string{"maxrate"}, "limit of each ring as a whole, like -r (0: unlimited)", func(c *qos.Config, v string) (err error) {
		c.MaxRateKbps, err = qos.ParseRate(v)
		return err
	}},
	{[]string{"traffic-class"}, "forced ToS byte 0..255 (DSCP × 4), -1: off", func(c *qos.Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 || n > 255 {
			return fmt.Errorf("traffic-class %q: want a ToS byte 0..255 (DSCP × 4, e.g. 96 for DSCP 24) or -1 for off", v)
		}
		c.TrafficClass = n
		return nil
	}},
	{[]string{"ttl"}, "forced TTL 1..255 of unicast datagrams, 0: off", func(c *qos.Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 255 {
			return fmt.Errorf("ttl %q: want 1..255, or 0 for off", v)
		}
		c.TTL = uint8(n)
		return nil
	}},
}

// qosChange is one setting given on the command line, in order.
type qosChange struct {
	s *qosSetting
	v string
}

func runQoS(o *options, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("bypassctl qos", flag.ContinueOnError)
	var help strings.Builder
	fs.SetOutput(&help)
	iface := fs.String("i", "", "interface (default: every interface)")
	fs.StringVar(iface, "interface", "", "interface")
	var changes []qosChange
	for i := range qosSettings {
		st := &qosSettings[i]
		for _, n := range st.names {
			fs.Func(n, st.usage, func(v string) error {
				changes = append(changes, qosChange{st, v})
				return nil
			})
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(w, "usage: bypassctl qos [-i IF [SETTINGS]]\n\nsettings, as mlnx_qos takes them:\n")
			fs.SetOutput(w)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("qos: %w (bypassctl qos -h lists the settings)", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("qos: unexpected %q (bypassctl qos -h lists the settings)", fs.Arg(0))
	}
	if len(changes) > 0 && *iface == "" {
		return errors.New("qos: say which interface to change with -i IF")
	}
	doc, err := qosDoc(o, *iface)
	if err != nil {
		return err
	}
	if len(changes) > 0 {
		c := doc.Interfaces[0].Config
		for _, ch := range changes {
			if err := ch.s.set(&c, ch.v); err != nil {
				return fmt.Errorf("qos: %w", err)
			}
		}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("qos %s: nothing changed:\n%w", *iface, err)
		}
		if err := setQoS(o, *iface, &c); err != nil {
			return err
		}
		if doc, err = qosDoc(o, *iface); err != nil {
			return err
		}
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

// qosDoc asks for the qos topic, of iface only when it is not empty.
func qosDoc(o *options, iface string) (*ctldoc.QoSDoc, error) {
	var doc ctldoc.QoSDoc
	if err := query(o, ctldoc.TopicQoS, &doc); err != nil {
		return nil, err
	}
	if iface == "" {
		return &doc, nil
	}
	for _, it := range doc.Interfaces {
		if it.Interface == iface {
			doc.Interfaces = []ctldoc.QoSInterface{it}
			return &doc, nil
		}
	}
	return nil, fmt.Errorf("qos: bypassd does not serve interface %q (bypassctl rings lists what it serves)", iface)
}

// setQoS sends SET_QOS.
func setQoS(o *options, iface string, c *qos.Config) error {
	a, err := dial(o)
	if err != nil {
		return err
	}
	defer a.Close()
	if _, _, err := a.Call(ctlproto.Header{Code: ctlproto.CodeSetQoS}, ctldoc.QoSToWire(iface, c)); err != nil {
		return ctlproto.AdminError("set the QoS of "+iface, err)
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
