//go:build !race

// The race detector allocates, so this guarantee is only built without it;
// make test (CI) runs it in its -run Alloc pass without -race.

package steer

import (
	"net/netip"
	"testing"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath"
)

// ObserveRouted runs on every proxied request: no allocation for a
// promoted client being re-validated or an unpromoted one being watched.
func TestObserveRoutedAllocs(t *testing.T) {
	r := newRig(t, true, 16)
	r.promote("10.1.0.2", 0)
	kept := &slowpath.RoutedEvent{Client: netip.MustParseAddrPort("10.1.0.2:40000"), ReplicaID: affinity.ReplicaID(r.src.reps[0].ID),
		Hashes: []uint64{7, 8}, PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.src.Now()}
	other := &slowpath.RoutedEvent{Client: netip.MustParseAddrPort("10.1.0.9:40000"), ReplicaID: affinity.ReplicaID(r.src.reps[1].ID),
		Hashes: []uint64{9}, PromptTokens: 1000, OK: true, End: r.src.Now()}
	for _, ev := range []*slowpath.RoutedEvent{kept, other} {
		if n := testing.AllocsPerRun(200, func() {
			ev.End += int64(time.Millisecond)
			r.c.ObserveRouted(ev)
		}); n != 0 {
			t.Errorf("%s: %v allocations per request", ev.Client, n)
		}
	}
	if _, ok := r.entry("10.1.0.2"); !ok {
		t.Fatal("re-validation dropped the entry")
	}
}
