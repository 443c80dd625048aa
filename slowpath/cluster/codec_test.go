package cluster

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"github.com/warmpath/warmpath/affinity"
)

func TestCodecRoundTrip(t *testing.T) {
	type rec struct {
		enc  func([]byte) []byte
		want Record
	}
	v4 := netip.MustParseAddr("10.1.2.3")
	v6 := netip.MustParseAddr("2001:db8::7")
	tests := []struct {
		name string
		kind byte
		recs []rec
	}{
		{name: "empty heartbeat", kind: msgBatch},
		{name: "every batch kind", kind: msgBatch, recs: []rec{
			{enc: func(b []byte) []byte { return appendInsert(b, 3, []uint64{1, 2, 1 << 63}) },
				want: Record{Kind: recInsert, Replica: 3, Hashes: []uint64{1, 2, 1 << 63}}},
			{enc: func(b []byte) []byte { return appendTruncate(b, 0, 0xdeadbeef, 7) },
				want: Record{Kind: recTruncate, Replica: 0, Tail: 0xdeadbeef, N: 7}},
			{enc: func(b []byte) []byte { return appendReset(b, 300) },
				want: Record{Kind: recReset, Replica: 300}},
			{enc: func(b []byte) []byte { return appendTail(b, 2, 0xfeedface) },
				want: Record{Kind: recTail, Replica: 2, Tail: 0xfeedface}},
			{enc: func(b []byte) []byte {
				return appendLoad(b, 1, affinity.PeerLoad{InFlight: 5, PendingPrefillTokens: 1 << 30, PendingRequests: 2})
			}, want: Record{Kind: recLoad, Replica: 1, Load: affinity.PeerLoad{InFlight: 5, PendingPrefillTokens: 1 << 30, PendingRequests: 2}}},
			{enc: func(b []byte) []byte { return appendEntry(b, 2, v4, true) },
				want: Record{Kind: recEntryAdd, Replica: 2, Client: v4}},
			{enc: func(b []byte) []byte { return appendEntry(b, 2, v6, false) },
				want: Record{Kind: recEntryDel, Replica: 2, Client: v6}},
			{enc: func(b []byte) []byte { return appendInsert(b, 4, []uint64{9}) },
				want: Record{Kind: recInsert, Replica: 4, Hashes: []uint64{9}}},
		}},
		{name: "snapshot", kind: msgSnapshot, recs: []rec{
			{enc: func(b []byte) []byte { return appendSnapshot(b, 0, []uint64{10, 11, 12}, []uint64{0, 10, 11}) },
				want: Record{Kind: recSnapshot, Replica: 0, Hashes: []uint64{10, 11, 12}, Parents: []uint64{0, 10, 11}}},
			{enc: func(b []byte) []byte { return appendSnapshot(b, 1, []uint64{20}, []uint64{0}) },
				want: Record{Kind: recSnapshot, Replica: 1, Hashes: []uint64{20}, Parents: []uint64{0}}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := appendHeader(nil, tt.kind, flagFull, 0xf00d, 0xbeef, 42, 1234567890123, "edge-a")
			b = appendUvarint(b, 2)
			b = appendTableEntry(b, 3, "10.0.0.1:8000")
			b = appendTableEntry(b, 300, "gpu-2:8000")
			for _, r := range tt.recs {
				b = r.enc(b)
			}
			var m Message
			if err := Decode(b, &m); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if m.Kind != tt.kind || m.Flags != flagFull || m.Fingerprint != 0xf00d || m.Incarnation != 0xbeef || m.Seq != 42 || m.SendNs != 1234567890123 || m.Instance != "edge-a" {
				t.Fatalf("header = %+v", m)
			}
			if want := []Name{{3, "10.0.0.1:8000"}, {300, "gpu-2:8000"}}; !slices.Equal(m.Names, want) {
				t.Fatalf("names = %v, want %v", m.Names, want)
			}
			if len(m.Records) != len(tt.recs) {
				t.Fatalf("%d records, want %d", len(m.Records), len(tt.recs))
			}
			for i, r := range tt.recs {
				g, w := m.Records[i], r.want
				if g.Kind != w.Kind || g.Replica != w.Replica || g.Tail != w.Tail || g.N != w.N || g.Load != w.Load ||
					g.Client != w.Client || !slices.Equal(g.Hashes, w.Hashes) || !slices.Equal(g.Parents, w.Parents) {
					t.Errorf("record %d = %+v, want %+v", i, g, w)
				}
			}
			// Every strict prefix is rejected or decodes to fewer records:
			// never a panic, never a record read past the end.
			for n := range len(b) {
				var p Message
				if err := Decode(b[:n], &p); err == nil && len(p.Records) >= len(tt.recs) && len(tt.recs) > 0 {
					t.Fatalf("prefix of %d/%d bytes decoded all %d records", n, len(b), len(p.Records))
				}
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := appendUvarint(appendHeader(nil, msgBatch, 0, 1, 1, 1, 1, "a"), 0)
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, errShort},
		{"magic", append([]byte("XPC"), good[3:]...), errMagic},
		{"version", append([]byte{'W', 'P', 'C', 9}, good[4:]...), errVersion},
		{"kind", append([]byte{'W', 'P', 'C', wireVersion, 9}, good[5:]...), errKind},
		{"no instance", appendUvarint(appendHeader(nil, msgBatch, 0, 1, 1, 1, 1, ""), 0), errInstance},
		{"unknown record", append(bytes.Clone(good), 99, 0), errRecord},
		{"snapshot record in batch", appendSnapshot(bytes.Clone(good), 0, []uint64{1}, []uint64{0}), errRecord},
		{"insert count beyond the bytes", append(bytes.Clone(good), recInsert, 0, 0xff, 0xff, 0x03), errRange},
		{"bad address length", append(bytes.Clone(good), recEntryAdd, 0, 5, 1, 2, 3, 4, 5), errAddr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Message
			if err := Decode(tt.b, &m); err != tt.want {
				t.Fatalf("Decode = %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	b := appendHeader(nil, msgBatch, 0, 7, 1, 1, 1, "edge")
	b = appendUvarint(b, 1)
	b = appendTableEntry(b, 0, "r0")
	b = appendInsert(b, 0, []uint64{1, 2, 3})
	b = appendTruncate(b, 0, 3, 2)
	b = appendLoad(b, 0, affinity.PeerLoad{InFlight: 1})
	b = appendEntry(b, 0, netip.MustParseAddr("10.0.0.9"), true)
	f.Add(b)
	s := appendHeader(nil, msgSnapshot, 0, 7, 1, 1, 1, "edge")
	s = appendUvarint(s, 1)
	s = appendTableEntry(s, 0, "r0")
	f.Add(appendSnapshot(s, 0, []uint64{1, 2}, []uint64{0, 1}))
	f.Add([]byte("WPC"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m Message
		if err := Decode(data, &m); err != nil {
			return
		}
		words := 0
		for _, r := range m.Records {
			words += len(r.Hashes) + len(r.Parents)
			if r.Kind == recSnapshot && len(r.Hashes) != len(r.Parents) {
				t.Fatalf("snapshot record with %d hashes, %d parents", len(r.Hashes), len(r.Parents))
			}
		}
		if 8*words > len(data) {
			t.Fatalf("%d words decoded from %d bytes", words, len(data))
		}
	})
}
