package affinity

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

func TestCollector(t *testing.T) {
	r, ids := newTestRouter(t, Config{Hash: HashConfig{BlockTokens: 16}, DefaultKVCapacityTokens: 1600}, 2)
	req := &Request{Model: []byte("m"), Hashes: []uint64{1, 2, 3}, PromptTokens: 60, Now: 1}
	var f, g Flight
	r.Begin(ids[0], req, nil, &f)
	r.FirstToken(&f, 2)
	r.End(&f, 3, -1, true)
	r.Begin(ids[0], req, nil, &f) // 48 of 60 tokens predicted cached
	r.Begin(ids[1], &Request{Model: []byte("m"), PromptTokens: 10}, nil, &g)
	r.SetDraining(ids[1], true)
	var d Decision
	_ = r.Decide(&Request{Model: []byte("x")}, &d)
	want := `
# HELP warmpath_affinity_decide_errors_total Decisions that found no replica, by reason.
# TYPE warmpath_affinity_decide_errors_total counter
warmpath_affinity_decide_errors_total{reason="model_not_found"} 1
warmpath_affinity_decide_errors_total{reason="no_replica"} 0
# HELP warmpath_affinity_index_pairs (block, replica) pairs tracked.
# TYPE warmpath_affinity_index_pairs gauge
warmpath_affinity_index_pairs 3
# HELP warmpath_affinity_prompt_tokens_total Estimated prompt tokens of begun requests.
# TYPE warmpath_affinity_prompt_tokens_total counter
warmpath_affinity_prompt_tokens_total 130
# HELP warmpath_affinity_replica_draining 1 if the replica is draining.
# TYPE warmpath_affinity_replica_draining gauge
warmpath_affinity_replica_draining{replica="r0"} 0
warmpath_affinity_replica_draining{replica="r1"} 1
# HELP warmpath_affinity_replica_index_capacity_blocks The replica's index bound, in blocks.
# TYPE warmpath_affinity_replica_index_capacity_blocks gauge
warmpath_affinity_replica_index_capacity_blocks{replica="r0"} 100
warmpath_affinity_replica_index_capacity_blocks{replica="r1"} 100
# HELP warmpath_affinity_replica_pending_prefill_tokens Router-local uncached prompt tokens awaiting prefill.
# TYPE warmpath_affinity_replica_pending_prefill_tokens gauge
warmpath_affinity_replica_pending_prefill_tokens{replica="r0"} 12
warmpath_affinity_replica_pending_prefill_tokens{replica="r1"} 10
`
	names := []string{"warmpath_affinity_decide_errors_total", "warmpath_affinity_index_pairs",
		"warmpath_affinity_prompt_tokens_total",
		"warmpath_affinity_replica_draining",
		"warmpath_affinity_replica_index_capacity_blocks", "warmpath_affinity_replica_pending_prefill_tokens"}
	got := scrape(t, prometheusRegistry(t, r), names)
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Fatalf("metrics\n got:\n%s\nwant:\n%s", got, want)
	}
}

// scrape gathers reg as Prometheus text, keeping only the named families.
func scrape(t *testing.T, reg *prometheus.Registry, names []string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if slices.Contains(names, mf.GetName()) {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.String()
}

func prometheusRegistry(t *testing.T, r *Router) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(r)); err != nil {
		t.Fatal(err)
	}
	return reg
}
