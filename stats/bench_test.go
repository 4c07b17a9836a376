package stats

import (
	"path/filepath"
	"testing"
)

// BenchmarkPublish1000 publishes a client with 1000 sockets, as the daemon
// does every interval.
func BenchmarkPublish1000(b *testing.B) {
	w, err := Create(filepath.Join(b.TempDir(), "1"), clientSpec(1000))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	snap := &Snapshot{Client: &Client{}, Sockets: make([]Socket, 1000)}
	for i := range snap.Sockets {
		snap.Sockets[i] = sampleSocket(uint32(i + 1))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := w.Publish(snap); err != nil {
			b.Fatal(err)
		}
	}
}
