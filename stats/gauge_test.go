package stats

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestGaugesMatchDoc: a ring counter is a gauge (never zeroed, never shown
// as a delta) exactly when docs/stats-file.md says "gauge:".
func TestGaugesMatchDoc(t *testing.T) {
	b, err := os.ReadFile("../docs/stats-file.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for c := RingCounter(0); c < NumRingCounters; c++ {
		row := fmt.Sprintf("| %d | %d | `%s` | ", ringCounterOff+8*int(c), int(c), c)
		i := strings.Index(doc, row)
		if i < 0 {
			t.Errorf("no row for %s", c)
			continue
		}
		documented := strings.HasPrefix(doc[i+len(row):], "gauge:")
		if documented != c.IsGauge() {
			t.Errorf("ring counter %s: documented as a gauge %v, IsGauge %v", c, documented, c.IsGauge())
		}
	}
}
