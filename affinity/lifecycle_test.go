package affinity

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFlightAccounting(t *testing.T) {
	sys := strings.Repeat("s", 64*256) // 64 blocks = 4096 tokens
	tests := []struct {
		name string
		run  func(t *testing.T, r *Router, id ReplicaID, req *Request)
	}{
		{"first token then end", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			var f Flight
			r.Begin(id, req, nil, &f)
			wantLoad(t, r, id, 1, req.PromptTokens)
			r.FirstToken(&f, int64(time.Second))
			wantLoad(t, r, id, 1, 0)
			r.End(&f, int64(2*time.Second), -1, true)
			r.End(&f, int64(2*time.Second), -1, true) // idempotent
			wantLoad(t, r, id, 0, 0)
		}},
		{"end without first token", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			var f Flight
			r.Begin(id, req, nil, &f)
			r.End(&f, 5, -1, true)
			wantLoad(t, r, id, 0, 0)
		}},
		{"failure before first token rolls back", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			var f Flight
			r.Begin(id, req, nil, &f)
			if got := cachedOn(t, r, req, id); got == 0 {
				t.Fatal("speculative insert missing")
			}
			r.End(&f, 5, -1, false)
			wantLoad(t, r, id, 0, 0)
			if got := cachedOn(t, r, req, id); got != 0 {
				t.Fatalf("rollback left %d cached tokens", got)
			}
			if r.Stats().Rollbacks != 1 {
				t.Fatal("rollback not counted")
			}
		}},
		{"rollback keeps what was cached before", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			short := request(t, chatBody("m", sys[:20*256]), 1)
			warm(r, id, short)
			before := cachedOn(t, r, req, id)
			var f Flight
			r.Begin(id, req, nil, &f)
			if f.UncachedTokens != req.PromptTokens-before {
				t.Fatalf("uncached %d, want %d", f.UncachedTokens, req.PromptTokens-before)
			}
			r.End(&f, 5, -1, false)
			if got := cachedOn(t, r, req, id); got != before {
				t.Fatalf("after rollback %d cached, want %d", got, before)
			}
		}},
		{"failure after first token keeps the prefix", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			var f Flight
			r.Begin(id, req, nil, &f)
			r.FirstToken(&f, 5)
			r.End(&f, 6, -1, false)
			if cachedOn(t, r, req, id) == 0 {
				t.Fatal("prefilled prefix dropped")
			}
		}},
		{"misprediction shrinks the index, hits grow it back", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			warm(r, id, req)
			capBefore := r.Replicas()[id].CapacityBlocks
			var f Flight
			r.Begin(id, req, nil, &f)
			r.End(&f, 5, 0, true) // engine: nothing was cached
			st := r.Replicas()[id]
			if st.Mispredictions != 1 || st.CapacityBlocks >= capBefore {
				t.Fatalf("status %+v, capacity before %d", st, capBefore)
			}
			r.Begin(id, req, nil, &f)
			r.End(&f, 6, req.PromptTokens, true)
			if got := r.Replicas()[id].CapacityBlocks; got != st.CapacityBlocks+1 {
				t.Fatalf("capacity %d after a hit, want %d", got, st.CapacityBlocks+1)
			}
		}},
		{"prefill rate is measured", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			for i := range 30 {
				var f Flight
				q := *req
				q.Hashes = nil // cold every time
				q.Now = int64(i) * int64(time.Second)
				r.Begin(id, &q, nil, &f)
				// 20000 tokens/s: prefill takes PromptTokens/20000 s.
				r.FirstToken(&f, q.Now+int64(float64(q.PromptTokens)/20000*1e9))
				r.End(&f, q.Now+int64(time.Millisecond*500), -1, true)
			}
			if rate := r.Replicas()[id].PrefillTokensPerSec; rate < 19000 || rate > 21000 {
				t.Fatalf("rate %.0f, want ~20000", rate)
			}
		}},
		{"an unpredicted cache hit does not inflate the rate", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			// The index predicts a cold prompt every time, but the engine
			// had it cached (another router sent it, say): first tokens come
			// after 2 ms. Timed against the predicted tokens this reads as
			// a prefill rate of PromptTokens/0.002 tokens/s.
			for i := range 60 {
				var f Flight
				q := *req
				q.Hashes = nil
				q.Now = int64(i) * int64(time.Second)
				r.Begin(id, &q, nil, &f)
				if i < 30 { // cold: 20000 tokens/s
					r.FirstToken(&f, q.Now+int64(float64(q.PromptTokens)/20000*1e9))
					r.End(&f, q.Now+int64(time.Millisecond*500), 0, true)
					continue
				}
				r.FirstToken(&f, q.Now+int64(2*time.Millisecond))
				r.End(&f, q.Now+int64(time.Millisecond*500), q.PromptTokens, true)
			}
			if rate := r.Replicas()[id].PrefillTokensPerSec; rate < 15000 || rate > 30000 {
				t.Fatalf("rate %.0f after unpredicted hits, want ~20000", rate)
			}
		}},
		{"a fixed overhead is fitted apart from the prefill rate", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			// ttft = 30 ms + tokens / 20000 for prompts of 0..8191 uncached
			// tokens; a ratio estimator would see 9000-18000 tokens/s.
			for i := range 200 {
				var f Flight
				q := *req
				q.Hashes = nil
				q.PromptTokens = (i * 2741) % 8192
				q.Now = int64(i) * int64(time.Second)
				r.Begin(id, &q, nil, &f)
				r.FirstToken(&f, q.Now+int64((0.030+float64(q.PromptTokens)/20000)*1e9))
				r.End(&f, q.Now+int64(time.Millisecond*500), -1, true)
			}
			st := r.Replicas()[id]
			if st.PrefillTokensPerSec < 19000 || st.PrefillTokensPerSec > 21000 {
				t.Fatalf("rate %.0f, want ~20000", st.PrefillTokensPerSec)
			}
			if st.OverheadSeconds < 0.028 || st.OverheadSeconds > 0.032 {
				t.Fatalf("overhead %.4f s, want ~0.030", st.OverheadSeconds)
			}
		}},
		{"buffered responses take no rate sample", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			q := *req
			q.Buffered = true
			for i := range 10 {
				var f Flight
				q.Hashes, q.Now = nil, int64(i)*int64(time.Second)
				r.Begin(id, &q, nil, &f)
				r.FirstToken(&f, q.Now+int64(500*time.Millisecond)) // whole response
				wantLoad(t, r, id, 1, 0)
				r.End(&f, q.Now+int64(500*time.Millisecond), -1, true)
			}
			if rate := r.Replicas()[id].PrefillTokensPerSec; rate != DefaultPrefillTokensPerSec {
				t.Fatalf("rate %.0f moved on buffered responses", rate)
			}
		}},
		{"reset cache forgets prefixes", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			warm(r, id, req)
			r.ResetCache(id)
			if cachedOn(t, r, req, id) != 0 {
				t.Fatal("reset kept prefixes")
			}
		}},
		{"removed replica: end is harmless, id reuse is clean", func(t *testing.T, r *Router, id ReplicaID, req *Request) {
			var f Flight
			r.Begin(id, req, nil, &f)
			r.RemoveReplica(id)
			nid, err := r.AddReplica(ReplicaSpec{Name: "again", Models: []string{"m"}})
			if err != nil || nid != id {
				t.Fatalf("reuse %v %v", nid, err)
			}
			if cachedOn(t, r, req, nid) != 0 {
				t.Fatal("new replica inherited old prefixes")
			}
			r.FirstToken(&f, 3)
			r.End(&f, 4, 0, false)
			wantLoad(t, r, nid, 0, 0)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ids := newTestRouter(t, Config{}, 2)
			req := request(t, chatBody("m", sys, "question"), 1)
			tt.run(t, r, ids[0], req)
			checkIndex(t, r.idx)
		})
	}
}

func wantLoad(t *testing.T, r *Router, id ReplicaID, inFlight, pending int) {
	t.Helper()
	for _, st := range r.Replicas() {
		if st.ID == id {
			if st.InFlight != inFlight || st.PendingPrefillTokens != pending {
				t.Fatalf("replica %d: in flight %d pending %d, want %d %d", id, st.InFlight, st.PendingPrefillTokens, inFlight, pending)
			}
			return
		}
	}
	t.Fatalf("replica %d missing", id)
}

// cachedOn is the predicted cached tokens of req on id.
func cachedOn(t *testing.T, r *Router, req *Request, id ReplicaID) int {
	t.Helper()
	r.mu.RLock()
	defer r.mu.RUnlock()
	var d Decision
	v := &d.view
	v.reset(r, req, r.groups["m"])
	return v.CachedTokens(id)
}

func TestReplicaLifecycle(t *testing.T) {
	r, ids := newTestRouter(t, Config{Policy: "least-request"}, 3)
	req := request(t, chatBody("m", "s", "u"), 1)
	tests := []struct {
		name string
		prep func()
		want []ReplicaID // set of eligible replicas
		err  error
	}{
		{"all", func() {}, ids, nil},
		{"draining excluded", func() { r.SetDraining(ids[0], true) }, ids[1:], nil},
		{"max in flight excluded", func() {
			if err := r.UpdateReplica(ids[1], ReplicaSpec{Name: "r1", Models: []string{"m"}, MaxInFlight: 1}); err != nil {
				t.Fatal(err)
			}
			var f Flight
			r.Begin(ids[1], req, nil, &f)
		}, ids[2:], nil},
		{"model moved away", func() {
			if err := r.UpdateReplica(ids[2], ReplicaSpec{Name: "r2", Models: []string{"other"}}); err != nil {
				t.Fatal(err)
			}
		}, nil, ErrNoReplica},
		{"undrain", func() { r.SetDraining(ids[0], false) }, ids[:1], nil},
		{"removed", func() { r.RemoveReplica(ids[0]); r.RemoveReplica(ids[1]) }, nil, ErrModelNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.prep()
			var d Decision
			err := r.Decide(req, &d)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			got := slices.Clone(d.Ranked)
			slices.Sort(got)
			if !slices.Equal(got, tt.want) && (len(got) != 0 || len(tt.want) != 0) {
				t.Fatalf("ranked %v, want %v", got, tt.want)
			}
		})
	}
	if m := r.Models(); !slices.Equal(m, []string{"other"}) {
		t.Fatalf("models %v", m)
	}
	if id, ok := r.Lookup("r2"); !ok || id != ids[2] {
		t.Fatalf("lookup %v %v", id, ok)
	}
	if _, ok := r.Lookup("r0"); ok {
		t.Fatal("removed replica found")
	}
	bad := []ReplicaSpec{{}, {Name: "x"}, {Name: "x", Models: []string{""}}, {Name: "x", Models: []string{"m"}, Weight: -1}}
	for _, s := range bad {
		if _, err := r.AddReplica(s); err == nil {
			t.Fatalf("spec %+v accepted", s)
		}
	}
}
