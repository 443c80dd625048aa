package affinity

import (
	"errors"
	"testing"
)

func TestReplacePeerLoads(t *testing.T) {
	r, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ReplicaID
	for _, nm := range []string{"r0", "r1", "r2"} {
		id, err := r.AddReplica(ReplicaSpec{Name: nm, Models: []string{"m"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	load := func(i int) (inFlight, pending int) {
		p := r.rep(ids[i])
		return int(p.peerInFlight.Load()), int(p.peerPending.Load())
	}
	// Peer 3 reported load on r0 and r1; peer 5 on r1.
	if err := r.ApplyPeer(3, []PeerUpdate{
		{Kind: PeerKindLoad, Replica: ids[0], Load: PeerLoad{InFlight: 4, PendingPrefillTokens: 100}},
		{Kind: PeerKindLoad, Replica: ids[1], Load: PeerLoad{InFlight: 2}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.ApplyPeer(5, []PeerUpdate{{Kind: PeerKindLoad, Replica: ids[1], Load: PeerLoad{InFlight: 1}}}); err != nil {
		t.Fatal(err)
	}
	// A full batch from peer 3 names only r2: r0 and r1 drop to zero for
	// peer 3 (peer 5's value stays), non-load kinds are ignored.
	if err := r.ReplacePeerLoads(3, []PeerUpdate{
		{Kind: PeerKindLoad, Replica: ids[2], Load: PeerLoad{InFlight: 7}},
		{Kind: PeerKindInsert, Replica: ids[2], Hashes: []uint64{1, 2}},
		{Kind: PeerKindLoad, Replica: 99, Load: PeerLoad{InFlight: 9}}, // unknown: skipped
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		replica       int
		inFlight, pre int
	}{
		{"unnamed replica zeroed", 0, 0, 0},
		{"other peer kept", 1, 1, 0},
		{"named replica set", 2, 7, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, p := load(tt.replica)
			if f != tt.inFlight || p != tt.pre {
				t.Fatalf("r%d: peer in-flight %d pending %d, want %d %d", tt.replica, f, p, tt.inFlight, tt.pre)
			}
		})
	}
	if n := r.idx.blocksOf(ids[2]); n != 0 {
		t.Errorf("insert applied by ReplacePeerLoads: index holds %d blocks", n)
	}
	if err := r.ReplacePeerLoads(MaxPeers, nil); !errors.Is(err, ErrPeerSlot) {
		t.Errorf("slot out of range: err %v", err)
	}
}
