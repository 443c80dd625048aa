package affinity

import "testing"

// lastPolicy ranks the highest ID first and records Begin calls.
type lastPolicy struct{ begun []ReplicaID }

func (*lastPolicy) Name() string { return "last" }

func (*lastPolicy) Rank(v *View, _ *Request, d *Decision) {
	c := v.Candidates()
	for i := len(c) - 1; i >= 0 && len(d.Ranked) < v.MaxRanked(); i-- {
		d.Ranked = append(d.Ranked, c[i])
	}
}

func (p *lastPolicy) OnBegin(id ReplicaID, _ *Request) { p.begun = append(p.begun, id) }

func TestNewRouterWithPolicy(t *testing.T) {
	p := &lastPolicy{}
	r, err := NewRouterWithPolicy(Config{Policy: "ignored"}, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if _, err := r.AddReplica(ReplicaSpec{Name: n, Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
	}
	req := &Request{Model: []byte("m"), Hashes: []uint64{1, 2}, PromptTokens: 128}
	var d Decision
	if err := r.Decide(req, &d); err != nil {
		t.Fatal(err)
	}
	if d.Policy != "last" || d.Ranked[0] != 2 || len(d.CachedTokens) != 3 {
		t.Fatalf("decision %+v", d)
	}
	var f Flight
	r.Begin(d.Ranked[0], req, &d, &f)
	if len(p.begun) != 1 || p.begun[0] != 2 {
		t.Fatalf("BeginHook not called: %v", p.begun)
	}
	if err := r.Decide(req, &d); err != nil || d.CachedTokens[0] != 128 {
		t.Fatalf("router did not fill CachedTokens from the index: %+v %v", d, err)
	}
}
