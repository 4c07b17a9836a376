package stats

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestDocMatchesLayout checks docs/stats-file.md against the constants:
// every field row and every counter row must name the offset the code
// uses.
func TestDocMatchesLayout(t *testing.T) {
	b, err := os.ReadFile("../docs/stats-file.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := func(off, size int, name string) {
		t.Helper()
		want := fmt.Sprintf("| %d | %d | %s |", off, size, name)
		if !strings.Contains(doc, want) {
			t.Errorf("docs/stats-file.md lacks the row %q", want)
		}
	}
	for _, f := range []struct {
		off, size int
		name      string
	}{
		{offMagic, 4, "magic"}, {offVersion, 4, "version"}, {offHeaderSize, 4, "header size"}, {offKind, 4, "kind"},
		{offFileSize, 8, "file size"}, {offWriterPID, 4, "writer pid"}, {offPID, 4, "pid"}, {offUID, 4, "uid"},
		{offStarted, 8, "started"}, {offSummaryOff, 4, "summary offset"}, {offSummarySize, 4, "summary size"},
		{offRingOff, 4, "ring offset"}, {offRingSize, 4, "ring block size"}, {offRingSlots, 4, "ring slots"},
		{offSocketOff, 4, "socket offset"}, {offSocketSize, 4, "socket block size"}, {offSocketSlots, 4, "socket slots"},
		{offCommand, lenCommand, "command"}, {offProgram, lenProgram, "program"}, {offSeq, 8, "sequence"},
		{offUpdated, 8, "updated"}, {offInterval, 8, "interval"}, {offResets, 8, "resets"}, {offResetTime, 8, "reset time"},
		{offRingsUsed, 4, "rings used"}, {offSocketsUsed, 4, "sockets used"}, {offSocketsTotal, 4, "sockets total"},
		// client block
		{offCSockets, 4, "sockets"}, {offCMaxSockets, 4, "max sockets"}, {offCOpened, 8, "sockets opened"},
		{offCQueueMemory, 8, "queue memory"}, {offCQueueLimit, 8, "queue memory limit"},
		{clientCounterOff, ClientBlockSize - clientCounterOff, "totals"},
		// daemon block
		{offDLogLevel, 4, "log level"}, {offDMaxSockets, 4, "max sockets"}, {offDQueueBytes, 4, "queue bytes"},
		{offDVersion, lenDVersion, "version"}, {offDSocketPath, lenDSocketPath, "socket path"},
		{daemonCounterOff, DaemonBlockSize - daemonCounterOff, "counters"},
		// ring block
		{offRIndex, 4, "index"}, {offRQueue, 4, "queue"}, {offRIfindex, 4, "ifindex"}, {offRFlags, 4, "flags"},
		{offRInterface, lenRName, "interface"}, {offRProvider, lenRName, "provider"}, {offRMode, lenRName, "mode"},
		{offRRXFrames, 4, "rx frames"}, {offRTXFrames, 4, "tx frames"}, {offRFrameSize, 4, "frame size"},
		{offRSockets, 4, "sockets"}, {offRDevMem, 8, "dev mem alloc"}, {ringCounterOff, RingBlockSize - ringCounterOff, "counters"},
		// socket block
		{offSID, 4, "socket id"}, {offSFlags, 4, "flags"}, {offSFamily, 2, "family"}, {offSRing, 2, "ring"},
		{offSTTL, 1, "ttl"}, {offSMcastTTL, 1, "multicast ttl"}, {offSTOS, 1, "tos"}, {offSLocal, 16, "local address"},
		{offSLocalPort, 2, "local port"}, {offSPeerPort, 2, "peer port"}, {offSQueueBytes, 4, "queue bytes"},
		{offSPeer, 16, "peer address"}, {offSGroupCount, 4, "groups"}, {offSCounters, 8 * socketCounterCap, "counters"},
		{offSGroups, MaxGroups * lenGroup, "memberships"},
	} {
		row(f.off, f.size, f.name)
	}
	counter := func(off, i int, name string) {
		t.Helper()
		want := fmt.Sprintf("| %d | %d | `%s` |", off, i, name)
		if !strings.Contains(doc, want) {
			t.Errorf("docs/stats-file.md lacks the counter row %q", want)
		}
	}
	for i := SocketCounter(0); i < NumSocketCounters; i++ {
		counter(offSCounters+8*int(i), int(i), i.String())
	}
	for i := RingCounter(0); i < NumRingCounters; i++ {
		counter(ringCounterOff+8*int(i), int(i), i.String())
	}
	for i := DaemonCounter(0); i < NumDaemonCounters; i++ {
		counter(daemonCounterOff+8*int(i), int(i), i.String())
	}
	for _, want := range []string{fmt.Sprintf("`0x%08x`", Magic), fmt.Sprintf("# Stats file layout (version %d)", Version),
		fmt.Sprintf("`%d` (client block) or `%d` (daemon block)", ClientBlockSize, DaemonBlockSize),
		fmt.Sprintf("| `%d` |", RingBlockSize), fmt.Sprintf("| `%d` |", SocketBlockSize)} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/stats-file.md lacks %q", want)
		}
	}
}
