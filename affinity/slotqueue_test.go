package affinity

import (
	"strings"
	"testing"
)

// TestSlotWaitersDelayedByRecompute: two 4-slot replicas, each running 4
// requests; a conversation's 3,072-token history is cached on r0. The
// other replica has one request waiting for a slot. A recompute there
// would delay that request (its slot frees only when a running request's
// decode, which shares steps with the prefill, ends), so the turn stays
// home while the home has one waiter more, and leaves only when the home's
// slot queue is longer by more than the recompute's cost to both.
func TestSlotWaitersDelayedByRecompute(t *testing.T) {
	history := strings.Repeat("abcdefgh", 1536) // 12 KiB = 3,072 tokens
	for _, tc := range []struct {
		homeWaiting int
		wantHome    bool
	}{
		{homeWaiting: 0, wantHome: true},
		{homeWaiting: 1, wantHome: true},
		{homeWaiting: 2, wantHome: true}, // one more than the other replica: stays
		{homeWaiting: 3, wantHome: false},
		{homeWaiting: 6, wantHome: false},
	} {
		r, ids := buildRouter(t, Config{}, state{n: 2, slots: []int{4, 4}, inFlight: []int{4, 4}, pending: []int{tc.homeWaiting, 1}})
		for _, id := range ids {
			storeF(&r.hotOf(id).slotSec, 0.12) // each request decodes 0.12 s in its slot
		}
		warm(r, ids[0], promptReq(t, history, "first question"))
		d := decide(t, r, promptReq(t, history, "next question"))
		if home := d.Ranked[0] == ids[0]; home != tc.wantHome {
			t.Errorf("home with %d waiting for a slot, the other with 1: ranked %v (home %v), want the home first: %v",
				tc.homeWaiting, d.Ranked, ids[0], tc.wantHome)
		}
	}
}
