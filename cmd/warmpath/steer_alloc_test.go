//go:build !race

// The race detector allocates, so this guarantee is only built without it.

package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/warmpath/warmpath/slowpath"
)

// TestSteerObserverAllocs: handing a proxied request to the control loop
// through the slowpath.Observer adapter allocates nothing.
func TestSteerObserverAllocs(t *testing.T) {
	r := newPeerRig(t)
	r.promote("10.1.0.2", 0)
	ev := &slowpath.RoutedEvent{Client: netip.MustParseAddrPort("10.1.0.2:40000"), ReplicaID: 0,
		Hashes: []uint64{7, 8}, PromptTokens: 1000, PredictedCachedTokens: 900, OK: true, End: r.Now()}
	if n := testing.AllocsPerRun(200, func() {
		ev.End += int64(time.Millisecond)
		r.obs.ObserveRouted(ev)
	}); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
	if _, ok := r.entry("10.1.0.2"); !ok {
		t.Fatal("re-validation dropped the entry")
	}
}
