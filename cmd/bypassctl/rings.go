package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

func init() {
	register(command{
		name: "rings", help: "the rings: interface queue, provider, XDP mode, engine CPUs, sockets, handoffs, state",
		topic: ctldoc.TopicRings, newDoc: func() any { return new(ctldoc.RingsDoc) },
		print: printRings,
	})
}

func printRings(w io.Writer, doc any) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RING\tINTERFACE\tQUEUE\tPROVIDER\tMODE\tXDP\tFRAMES rx/tx×size\tCPUS\tSOCKETS\tRX PKTS\tTX PKTS\tHANDOFF out/in/dropped\tSTATE")
	var notes []string
	for _, r := range doc.(*ctldoc.RingsDoc).Rings {
		xdp := r.XDPMode
		if xdp == "" {
			xdp = "-"
		}
		cpus := "any"
		if len(r.CPUs) > 0 {
			list := make([]string, len(r.CPUs))
			for i, c := range r.CPUs {
				list[i] = strconv.Itoa(c)
			}
			cpus = strings.Join(list, ",")
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%d/%d×%d\t%s\t%d\t%d\t%d\t%d/%d/%d\t%s\n",
			r.Index, r.Interface, r.Queue, r.Provider, r.Mode, xdp, r.RXFrames, r.TXFrames, r.FrameSize,
			cpus, r.Sockets, r.RXPackets, r.TXPackets, r.HandedOff, r.HandoffIn, r.HandoffDropped, r.State)
		if r.XDPFallback != "" {
			notes = append(notes, fmt.Sprintf("ring %d: %s XDP because native attach failed: %s", r.Index, r.XDPMode, r.XDPFallback))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}
