package vxlan

import (
	"testing"

	"github.com/bypassd/bypassd/ring/wire/packet"
)

// BenchmarkBuild64: a 64-byte datagram's frame, plain and encapsulated.
func BenchmarkBuild64(b *testing.B) {
	tm := testTemplate(&testing.T{}, false, 1450)
	payload := make([]byte, 64)
	buf := make([]byte, 256)
	b.Run("plain", func(b *testing.B) {
		for range b.N {
			_, _ = tm.Inner.BuildFrame(buf, payload, 0, 1)
		}
	})
	b.Run("vxlan", func(b *testing.B) {
		for range b.N {
			_, _ = tm.BuildFrame(buf, payload, 0, 1)
		}
	})
}

// BenchmarkParse64: parsing a received 64-byte datagram's frame, plain and
// decapsulated (outer parse, Decap, inner parse).
func BenchmarkParse64(b *testing.B) {
	tm := testTemplate(&testing.T{}, false, 1450)
	payload := make([]byte, 64)
	enc := make([]byte, 256)
	n, _ := tm.BuildFrame(enc, payload, 0, 1)
	enc = enc[:n]
	plain := enc[EncapLen4:]
	var f, in packet.Frame
	b.Run("plain", func(b *testing.B) {
		for range b.N {
			_ = packet.Parse(plain, &f)
		}
	})
	b.Run("vxlan", func(b *testing.B) {
		for range b.N {
			_ = packet.Parse(enc, &f)
			_, inner, _ := Decap(f.Payload)
			_ = packet.Parse(inner, &in)
		}
	})
}
