package affinity

import (
	"sync"
	"testing"
)

// TestEligibility: Healthy, Eligible, AtLimit, InFlight and MaxInFlight
// follow SetHealthy, SetDraining, the spec's limit and Begin/End, and
// agree with what Decide ranks.
func TestEligibility(t *testing.T) {
	r, err := NewRouter(Config{Policy: "least-request"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := r.AddReplica(ReplicaSpec{Name: "a", Models: []string{"m"}, MaxInFlight: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.AddReplica(ReplicaSpec{Name: "b", Models: []string{"m"}})
	if err != nil {
		t.Fatal(err)
	}
	ranked := func() map[ReplicaID]bool {
		var d Decision
		got := map[ReplicaID]bool{}
		if err := r.Decide(&Request{Model: []byte("m"), Now: 1}, &d); err == nil {
			for _, id := range d.Ranked {
				got[id] = true
			}
		}
		return got
	}
	type want struct {
		healthy, eligible, atLimit bool
		inFlight, max              int
	}
	check := func(step string, id ReplicaID, w want) {
		t.Helper()
		got := want{r.Healthy(id), r.Eligible(id), r.AtLimit(id), r.InFlight(id), r.MaxInFlight(id)}
		if got != w {
			t.Errorf("%s: replica %d: got %+v, want %+v", step, id, got, w)
		}
		if rk := ranked()[id]; rk != w.eligible {
			t.Errorf("%s: replica %d: ranked by Decide %v, Eligible %v", step, id, rk, w.eligible)
		}
	}
	check("added", a, want{true, true, false, 0, 2})
	check("added", b, want{true, true, false, 0, 0})

	req := &Request{Model: []byte("m"), PromptTokens: 10, Now: 1}
	var f1, f2 Flight
	r.Begin(a, req, nil, &f1)
	check("one in flight", a, want{true, true, false, 1, 2})
	r.Begin(a, req, nil, &f2)
	check("at limit", a, want{true, false, true, 2, 2})
	r.End(&f1, 2, -1, true)
	check("one ended", a, want{true, true, false, 1, 2})

	r.SetHealthy(a, false)
	check("unhealthy", a, want{false, false, false, 1, 2})
	r.SetHealthy(a, true)
	r.SetDraining(a, true)
	check("draining", a, want{true, false, false, 1, 2})
	r.SetDraining(a, false)

	if err := r.UpdateReplica(a, ReplicaSpec{Name: "a", Models: []string{"m"}, MaxInFlight: 1}); err != nil {
		t.Fatal(err)
	}
	check("limit lowered", a, want{true, false, true, 1, 1})
	r.End(&f2, 3, -1, true)
	check("all ended", a, want{true, true, false, 0, 1})

	r.RemoveReplica(b)
	check("removed", b, want{false, false, false, 0, 0})
	check("unknown", NoReplica, want{false, false, false, 0, 0})
}

// TestTryBegin: TryBegin takes a slot below the limit only; refused, it
// changes nothing; concurrent callers never exceed the limit.
func TestTryBegin(t *testing.T) {
	r, err := NewRouter(Config{Policy: "round-robin"})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 3
	id, err := r.AddReplica(ReplicaSpec{Name: "a", Models: []string{"m"}, MaxInFlight: limit})
	if err != nil {
		t.Fatal(err)
	}
	free, err := r.AddReplica(ReplicaSpec{Name: "free", Models: []string{"m"}})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Model: []byte("m"), PromptTokens: 100, Hashes: []uint64{11, 12}, Now: 1}
	var fs [limit]Flight
	for i := range fs {
		if !r.TryBegin(id, req, nil, &fs[i]) || fs[i].Replica != id {
			t.Fatalf("TryBegin %d below the limit refused (flight %+v)", i, fs[i])
		}
	}
	before := r.Replicas()[id]
	st := r.Stats()
	var f Flight
	if r.TryBegin(id, req, nil, &f) {
		t.Fatal("TryBegin at the limit took a slot")
	}
	if f.Replica != NoReplica {
		t.Errorf("refused flight names replica %d", f.Replica)
	}
	if after := r.Replicas()[id]; after.InFlight != before.InFlight || after.PendingPrefillTokens != before.PendingPrefillTokens {
		t.Errorf("refused TryBegin changed the load: %+v -> %+v", before, after)
	}
	if r.Stats().PromptTokens != st.PromptTokens {
		t.Error("refused TryBegin counted its prompt")
	}
	if r.TryBegin(ReplicaID(99), req, nil, &f) || f.Replica != NoReplica {
		t.Error("TryBegin on an unknown id took a slot")
	}
	if !r.TryBegin(free, req, nil, &f) {
		t.Error("TryBegin on an unlimited replica refused")
	}
	r.End(&f, 2, -1, true)
	r.End(&fs[0], 2, -1, true)
	if !r.TryBegin(id, req, nil, &f) {
		t.Fatal("TryBegin refused after a slot was freed")
	}
	r.End(&f, 3, -1, true)
	for i := 1; i < limit; i++ {
		r.End(&fs[i], 3, -1, true)
	}

	// Concurrent: many goroutines race for the slots; the in-flight count
	// never passes the limit, and every refusal happened at the limit.
	var wg sync.WaitGroup
	var mu sync.Mutex
	maxSeen := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := &Request{Model: []byte("m"), PromptTokens: 10, Now: int64(g)}
			for range 500 {
				var f Flight
				if !r.TryBegin(id, q, nil, &f) {
					continue
				}
				n := r.InFlight(id)
				mu.Lock()
				maxSeen = max(maxSeen, n)
				mu.Unlock()
				r.End(&f, int64(g)+1, -1, true)
			}
		}()
	}
	wg.Wait()
	if maxSeen > limit || maxSeen == 0 {
		t.Errorf("in flight peaked at %d, limit %d", maxSeen, limit)
	}
	if n := r.InFlight(id); n != 0 {
		t.Errorf("in flight after every End: %d", n)
	}
}
