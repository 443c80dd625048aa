//go:build !race

// The race detector allocates, so this guarantee is only built without it;
// make test (CI) runs it in its -run Alloc pass without -race.

package steer_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath/steer"
	"github.com/warmpath/warmpath/fastpath/steer/steertest"
)

// ObserveRouted runs on every proxied request: no allocation for a
// promoted client being re-validated or an unpromoted one being watched.
func TestObserveRoutedAllocs(t *testing.T) {
	r := steertest.New(t, true, 16)
	r.Promote("10.1.0.2", 0)
	kept := &steer.Routed{Client: netip.MustParseAddrPort("10.1.0.2:40000"), ReplicaID: affinity.ReplicaID(r.Src.Reps[0].ID),
		FirstBlock: 7, PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.Src.Now()}
	other := &steer.Routed{Client: netip.MustParseAddrPort("10.1.0.9:40000"), ReplicaID: affinity.ReplicaID(r.Src.Reps[1].ID),
		FirstBlock: 9, PromptTokens: 1000, OK: true, End: r.Src.Now()}
	for _, ev := range []*steer.Routed{kept, other} {
		if n := testing.AllocsPerRun(200, func() {
			ev.End += int64(time.Millisecond)
			r.C.ObserveRouted(ev)
		}); n != 0 {
			t.Errorf("%s: %v allocations per request", ev.Client, n)
		}
	}
	if _, ok := r.Entry("10.1.0.2"); !ok {
		t.Fatal("re-validation dropped the entry")
	}
}
