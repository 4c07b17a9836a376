package main

import (
	"strings"
	"testing"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

func TestPrintConnections(t *testing.T) {
	doc := &ctldoc.ConnectionsDoc{Connections: []ctldoc.ConnectionDoc{
		{Ring: 0, Local: "10.0.0.1:40000", Remote: "10.0.0.2:5201", State: "ESTABLISHED", PID: 42, Socket: 7,
			RTTMicros: 1500, RTTVarMicros: 250, RTOMillis: 201, Cwnd: 10, Ssthresh: 7, Retransmits: 3, Timeouts: 1,
			SegmentsOut: 100, SegmentsIn: 90, BytesOut: 4096, BytesIn: 2048, SendQueued: 5, RecvQueued: 6, PumpWakeups: 77},
		{Ring: 1, Local: "10.0.0.1:80", Remote: "10.0.0.3:1234", State: "FIN-WAIT2"},
	}}
	var b strings.Builder
	if err := printConnections(&b, doc); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", b.String())
	}
	for _, want := range []string{"10.0.0.2:5201", "ESTABLISHED", "42/7", "1.500 (0.250)", "201", "100/90", "4096/2048", "5/6", "77"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row %q lacks %q", lines[1], want)
		}
	}
	if f := strings.Fields(lines[2]); f[4] != "-" {
		t.Errorf("a connection no client holds shows owner %q, want -", f[4])
	}
}
