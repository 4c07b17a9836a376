package main

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	b := newMessage(64, flagClient|flagPong)
	putSeq(b, 0x0102030405060708)
	// The wire layout, byte by byte: seq u64 | flags u16 | length u32, BE.
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8, 0, 3, 0, 0, 0, 64}
	if !bytes.Equal(b[:headerSize], want) {
		t.Fatalf("header bytes % x, want % x", b[:headerSize], want)
	}
	h, err := parseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	if h != (header{Seq: 0x0102030405060708, Flags: 3, Length: 64}) {
		t.Fatalf("parsed %+v", h)
	}
	putFlags(b, flagPong)
	if h, _ := parseHeader(b); h.Flags != flagPong {
		t.Fatalf("flags %#x after putFlags", h.Flags)
	}
	for i := headerSize; i < len(b); i++ {
		if b[i] != byte(i) {
			t.Fatalf("payload byte %d = %d", i, b[i])
		}
	}
}

func TestParseHeaderRejects(t *testing.T) {
	msg := func(size int, length uint32) []byte {
		b := make([]byte, size)
		if size >= headerSize {
			binary.BigEndian.PutUint32(b[10:14], length)
		}
		return b
	}
	cases := map[string][]byte{
		"empty":              nil,
		"runt 1":             {1},
		"runt 13":            make([]byte, 13),
		"length 0":           msg(14, 0),
		"length 13":          msg(14, 13),
		"length above dgram": msg(64, 65),
		"length below dgram": msg(64, 63),
		"length too large":   msg(64, maxMessage+1),
		"length max uint32":  msg(64, ^uint32(0)),
		"oversized dgram":    msg(maxMessage+1, maxMessage+1),
	}
	for name, b := range cases {
		if _, err := parseHeader(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for _, size := range []int{headerSize, 1400, maxMessage} {
		if _, err := parseHeader(msg(size, uint32(size))); err != nil {
			t.Errorf("size %d: %v", size, err)
		}
	}
}

// FuzzParseHeader: any datagram either parses to a header that frames it
// exactly or is rejected; nothing panics.
func FuzzParseHeader(f *testing.F) {
	f.Add(newMessage(14, flagClient|flagPong))
	f.Add(newMessage(100, flagClient))
	f.Add([]byte{})
	f.Add(make([]byte, 14))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err == nil && (int(h.Length) != len(b) || h.Length < headerSize || h.Length > maxMessage) {
			t.Fatalf("accepted %+v for a %d-byte datagram", h, len(b))
		}
	})
}
