package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

// The document's second mlnx_qos example (-s ets,ets,strict
// -p 0,1,1,1,2,2,2 -t 30,70 -r 3,4,2 on an all-zero egress map) printed
// field by field as mlnx_qos prints it.
func TestPrintQoSDocumentExample(t *testing.T) {
	c := qos.Default()
	for _, err := range []error{
		c.SetTSA("ets,ets,strict"), c.SetPrioTC("0,1,1,1,2,2,2"), c.SetTCBW("30,70"),
		c.SetRateLimit("3,4,2"), c.SetSkPrioUP("0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	printQoS(&b, &ctldoc.QoSInterface{Interface: "ens1f0", Rings: 1, Config: c})
	out := b.String()
	for _, want := range []string{
		"Priority trust state: pcp\n",
		"\tprio:0 dscp:07,06,05,04,03,02,01,00,\n",
		"\tprio:7 dscp:63,62,61,60,59,58,57,56,\n",
		"tc: 0 ratelimit: 3 Gbps, tsa: ets, bw: 30%\n\t up: 0\n\t\t skprio: 0\n\t\t skprio: 1\n\t\t skprio: 2 (tos: 8)\n\t\t skprio: 3\n\t\t skprio: 4 (tos: 24)\n\t\t skprio: 5\n\t\t skprio: 6 (tos: 16)\n\t\t skprio: 7\n",
		"\t\t skprio: 15\n\t up: 7\n",
		"tc: 1 ratelimit: 4 Gbps, tsa: ets, bw: 70%\n\t up: 1\n\t up: 2\n\t up: 3\n",
		"tc: 2 ratelimit: 2 Gbps, tsa: strict\n\t up: 4\n\t up: 5\n\t up: 6\n",
		"Forced traffic_class: off, ttl: off\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
