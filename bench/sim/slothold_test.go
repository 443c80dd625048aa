package sim

import (
	"cmp"
	"reflect"
	"slices"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

// TestSlotHoldsInTheSimulator: one-company bursts on two llama.cpp-like
// servers (slots each caching their own prompt). The cost policy holds
// requests whose prompt a busy slot is computing (affinity.HoldAdvice)
// as the proxy does; a held request's TTFT counts from its arrival, not
// from when it reached the engine; runs are deterministic; with
// routing.slot_hold off nothing is held.
func TestSlotHoldsInTheSimulator(t *testing.T) {
	// A first company's requests, then, once the routers have measured
	// the engines, a second company's bursts with instructions new to the
	// fleet (holds are priced on measured slot times only).
	w := &workload.Workload{Name: "two-companies"}
	for k, n := range []int{8, 64} {
		oc := workload.DefaultOneCompany()
		oc.Requests, oc.Users, oc.BurstSize, oc.RPS, oc.OutputTokens, oc.Seed = n, 16, 8, 2, 32, uint64(k+1)
		c, err := workload.OneCompany(oc)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range c.Requests {
			r.Arrival += int64(k) * 30e9
			w.Requests = append(w.Requests, r)
		}
	}
	slices.SortStableFunc(w.Requests, func(a, b workload.Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
	eng, err := FleetEngines("llamacpp", 2)
	if err != nil {
		t.Fatal(err)
	}
	run := func(hold bool) *Result {
		t.Helper()
		cfg := Config{Replicas: 2, Engines: eng, Policy: "cost", Seed: 1, KeepOutcomes: true}
		if !hold {
			cfg.Router.SlotHold = -1
		}
		r, err := Run(cfg, &workload.Workload{Name: w.Name, Params: w.Params, Requests: slices.Clone(w.Requests)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != len(w.Requests) {
			t.Fatalf("completed %d of %d", r.Completed, len(w.Requests))
		}
		return r
	}
	with, again, off := run(true), run(true), run(false)
	t.Logf("holds %d; mean TTFT %.3fs with holds, %.3fs without; hit rate %.2f / %.2f", with.Holds, with.TTFT.Mean, off.TTFT.Mean, with.HitRate, off.HitRate)
	if with.Holds == 0 {
		t.Fatal("no request held")
	}
	if off.Holds != 0 {
		t.Fatalf("slot_hold off: %d holds", off.Holds)
	}
	if with.Holds != again.Holds || !reflect.DeepEqual(with.TTFT, again.TTFT) || !reflect.DeepEqual(with.Outcomes, again.Outcomes) {
		t.Fatal("two runs of one seed differ")
	}
	held := 0
	for _, o := range with.Outcomes {
		if o.Submitted > o.Arrival {
			held++
			if o.TTFT < o.Submitted-o.Arrival {
				t.Fatalf("request %d held %.3fs, TTFT %.3fs: the hold is not in it", o.ID, o.Submitted-o.Arrival, o.TTFT)
			}
		}
	}
	if held == 0 {
		t.Fatal("no outcome reached its engine after its arrival")
	}
}
