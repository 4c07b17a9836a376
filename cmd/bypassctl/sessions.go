package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

func init() {
	register(command{
		name: "sessions", help: "client processes and their sockets (other users' only for root)",
		topic: ctldoc.TopicSessions, newDoc: func() any { return new(ctldoc.SessionsDoc) },
		print: printSessions,
	})
}

func printSessions(w io.Writer, doc any) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tUID\tPROGRAM\tSOCKET\tFAMILY\tRING\tLOCAL\tPEER\tRX PKTS\tTX PKTS")
	for _, s := range doc.(*ctldoc.SessionsDoc).Sessions {
		if len(s.Sockets) == 0 {
			fmt.Fprintf(tw, "%d\t%d\t%s\t-\t\t\t\t\t\t\n", s.PID, s.UID, orDash(s.Program))
			continue
		}
		for _, k := range s.Sockets {
			local := orDash(k.Local)
			if k.Broken {
				local += " (broken)"
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%d\t%s\t%s\t%d\t%d\n",
				s.PID, s.UID, orDash(s.Program), k.ID, k.Family, k.Ring, local, orDash(k.Peer), k.RXPackets, k.TXPackets)
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
