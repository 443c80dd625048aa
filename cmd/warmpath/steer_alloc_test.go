//go:build !race

// The race detector allocates, so this guarantee is only built without it.

package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/warmpath/warmpath/fastpath/steer/steertest"
	"github.com/warmpath/warmpath/slowpath"
)

// TestSteerObserverAllocs: handing a proxied request to the control loop
// through the slowpath.Observer adapter allocates nothing.
func TestSteerObserverAllocs(t *testing.T) {
	r := steertest.New(t, true, 16)
	obs := steerObserver{r.C}
	r.Promote("10.1.0.2", 0)
	ev := &slowpath.RoutedEvent{Client: netip.MustParseAddrPort("10.1.0.2:40000"), ReplicaID: 0,
		Hashes: []uint64{7, 8}, PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.Src.Now()}
	if n := testing.AllocsPerRun(200, func() {
		ev.End += int64(time.Millisecond)
		obs.ObserveRouted(ev)
	}); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
	if _, ok := r.Entry("10.1.0.2"); !ok {
		t.Fatal("re-validation dropped the entry")
	}
}
