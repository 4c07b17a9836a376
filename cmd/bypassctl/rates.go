package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

func init() {
	register(command{
		name: "rates", help: "the pacing rate table of each interface: rates in use, sharing, limits, refusals",
		topic: ctldoc.TopicRates, newDoc: func() any { return new(ctldoc.RatesDoc) },
		print: printRates,
	})
}

func printRates(w io.Writer, doc any) error {
	for i, t := range doc.(*ctldoc.RatesDoc).Tables {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s: %d of %d rates used, %d of %d paced sockets, range %s..%s, when full: %s\n",
			t.Interface, t.Used, t.Capacity, t.Queues, t.MaxQueues, pacing.FormatKbps(t.MinKbps), pacing.FormatKbps(t.MaxKbps), t.Policy)
		fmt.Fprintf(w, "granted %d (shared %d, nearest %d), refused: full %d, out of range %d\n",
			t.Acquired, t.Shared, t.Nearest, t.RefusedFull, t.RefusedRange)
		if len(t.Entries) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ENTRY\tRATE\tKBIT/S\tBURST\tTYPICAL\tSOCKETS")
		for _, e := range t.Entries {
			burst := fmt.Sprintf("%d", e.Burst)
			if e.MaxBurst == 0 {
				burst += " (default)"
			}
			typical := "-"
			if e.TypicalBytes != 0 {
				typical = fmt.Sprintf("%d", e.TypicalBytes)
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\n", e.Index, pacing.FormatKbps(e.Kbps), e.Kbps, burst, typical, e.Users)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
