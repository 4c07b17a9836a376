package main

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

func init() {
	register(command{
		name: "connections", help: "the rings' TCP connections: state, RTT, congestion window, retransmits, bytes, owner (like ss -ti)",
		topic: ctldoc.TopicConnections, newDoc: func() any { return new(ctldoc.ConnectionsDoc) },
		print: printConnections,
	})
}

func printConnections(w io.Writer, doc any) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RING\tLOCAL\tREMOTE\tSTATE\tPID/SOCKET\tRTT ms (var)\tRTO ms\tCWND\tSSTHRESH\tRETRANS\tTIMEOUTS\tSEGS out/in\tBYTES out/in\tQUEUED send/recv\tWAKEUPS")
	for _, c := range doc.(*ctldoc.ConnectionsDoc).Connections {
		owner := "-"
		if c.PID != 0 {
			owner = strconv.Itoa(int(c.PID)) + "/" + strconv.FormatUint(uint64(c.Socket), 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%.3f (%.3f)\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%d/%d\t%d/%d\t%d\n",
			c.Ring, c.Local, c.Remote, c.State, owner, float64(c.RTTMicros)/1000, float64(c.RTTVarMicros)/1000, c.RTOMillis,
			c.Cwnd, c.Ssthresh, c.Retransmits, c.Timeouts, c.SegmentsOut, c.SegmentsIn, c.BytesOut, c.BytesIn,
			c.SendQueued, c.RecvQueued, c.PumpWakeups)
	}
	return tw.Flush()
}
