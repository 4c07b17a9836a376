package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

func init() {
	register(command{
		name: "flows", help: "the steering entries: which destinations go to which ring queue",
		topic: ctldoc.TopicFlows, newDoc: func() any { return new(ctldoc.FlowsDoc) },
		print: printFlows,
	})
}

func printFlows(w io.Writer, doc any) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INTERFACE\tPROTO\tDESTINATION\tSOURCE\tQUEUE\tOVERLAY")
	for _, f := range doc.(*ctldoc.FlowsDoc).Flows {
		src := f.Src
		if src == "" {
			src = "any"
		}
		overlay := "-"
		if f.VNI != 0 {
			overlay = fmt.Sprintf("vxlan %d port %d", f.VNI, f.VXLANPort)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", f.Interface, f.Proto, f.Dst, src, f.Queue, overlay)
	}
	return tw.Flush()
}
