package cluster

import (
	"testing"
	"time"
)

type fakeLedger struct {
	local map[string][3]int64
	peer  map[string][3]int64 // peer/tenant
}

func (f *fakeLedger) LocalUsage(all bool, fn func(string, int64, int64, int64)) {
	for k, v := range f.local {
		fn(k, v[0], v[1], v[2])
	}
}

func (f *fakeLedger) SetPeerUsage(peer, tenant string, in, out, fl int64) {
	f.peer[peer+"/"+tenant] = [3]int64{in, out, fl}
}

func usageMsg(seq uint64, inc uint64, instance string, fp uint64, recs ...UsageRecord) []byte {
	b := appendHeader(nil, msgUsage, 0, fp, inc, seq, time.Now().UnixNano(), instance)
	b = appendUvarint(b, 0)
	for _, r := range recs {
		b = appendUvarint(b, uint64(len(r.Tenant)))
		b = append(b, r.Tenant...)
		b = appendUvarint(b, uint64(r.In))
		b = appendUvarint(b, uint64(r.Out))
		b = appendUvarint(b, uint64(r.InFlight))
	}
	return b
}

// TestUsageCodec: usage messages round-trip, truncations and garbage are
// refused without panic, and the batch decoder refuses the kind (an
// instance without budget sharing drops them and keeps its batches).
func TestUsageCodec(t *testing.T) {
	want := []UsageRecord{{"acme", 1200, 300, 2}, {"b", 0, 0, 1}}
	b := usageMsg(7, 9, "edge-1", 42, want...)
	var m Message
	got, err := DecodeUsage(b, &m, nil)
	if err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] || m.Instance != "edge-1" || m.Seq != 7 || m.Incarnation != 9 || m.Fingerprint != 42 {
		t.Fatalf("round trip: %+v %+v %v", got, m, err)
	}
	for i := range len(b) - 1 {
		if _, err := DecodeUsage(b[:i], &m, nil); err == nil && i > headerFixed+8 {
			// A cut between two records is a valid shorter message; any
			// other cut must fail.
			if r, _ := DecodeUsage(b[:i], &m, nil); len(r) != 1 {
				t.Fatalf("truncated at %d decoded %v", i, r)
			}
		}
	}
	if err := Decode(b, &m); err != errKind {
		t.Fatalf("batch decoder on a usage message: %v", err)
	}
	if isUsage(appendHeader(nil, msgBatch, 0, 1, 1, 1, 1, "x")) {
		t.Fatal("a batch taken for usage")
	}
}

// TestApplyUsage: a peer's usage reaches the ledger; older sequences, a
// wrong subject, our own name and another fingerprint do not.
func TestApplyUsage(t *testing.T) {
	n := &Node{cfg: Config{Instance: "me", MaxAge: 2 * time.Second}, fp: 42, m: newMetrics(), subjPfx: "warmpath.u."}
	f := &fakeLedger{peer: map[string][3]int64{}}
	n.usage.ledger, n.usage.last = f, map[string]usagePeer{}
	n.usage.sent, n.usage.recv = newMetrics().batchesSent, newMetrics().batchesReceived
	now := time.Now()
	n.applyUsage("warmpath.u.edge-2", usageMsg(2, 5, "edge-2", 42, UsageRecord{"acme", 100, 10, 1}), now)
	if f.peer["edge-2/acme"] != [3]int64{100, 10, 1} {
		t.Fatalf("not applied: %v", f.peer)
	}
	n.applyUsage("warmpath.u.edge-2", usageMsg(1, 5, "edge-2", 42, UsageRecord{"acme", 1, 1, 1}), now)
	n.applyUsage("warmpath.u.edge-3", usageMsg(3, 5, "edge-2", 42, UsageRecord{"acme", 2, 2, 2}), now)
	n.applyUsage("warmpath.u.me", usageMsg(3, 5, "me", 42, UsageRecord{"acme", 3, 3, 3}), now)
	n.applyUsage("warmpath.u.edge-2", usageMsg(3, 5, "edge-2", 41, UsageRecord{"acme", 4, 4, 4}), now)
	if f.peer["edge-2/acme"] != [3]int64{100, 10, 1} || len(f.peer) != 1 {
		t.Fatalf("a refused message applied: %v", f.peer)
	}
	// A restart (new incarnation) starts its sequence over.
	n.applyUsage("warmpath.u.edge-2", usageMsg(1, 6, "edge-2", 42, UsageRecord{"acme", 50, 5, 0}), now)
	if f.peer["edge-2/acme"] != [3]int64{50, 5, 0} {
		t.Fatalf("restart: %v", f.peer)
	}
}
