package sim

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/workload"
)

// TestRouterGetsNoEngineGroundTruth: the simulated router is configured as
// a production one is from a config file that names each replica: no
// prefill rate, KV capacity or batch size. Its estimates before traffic are
// affinity's defaults, not the engines' true figures; what it later knows
// comes from scrapes, TTFTs and usage.
func TestRouterGetsNoEngineGroundTruth(t *testing.T) {
	w := smallShared(t, 40)
	for _, fleet := range []string{"vllm", "llamacpp", "hetero", "batch-4"} {
		t.Run(fleet, func(t *testing.T) {
			engines, err := FleetEngines(fleet, 4)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"cost", "oracle"} {
				c, err := newCluster(Config{Replicas: 4, Engines: engines, Policy: p, Routers: 2}, w)
				if err != nil {
					t.Fatal(err)
				}
				for i, spec := range c.specs {
					want := affinity.ReplicaSpec{Name: fmt.Sprintf("engine-%d", i), Models: spec.Models}
					if !reflect.DeepEqual(spec, want) {
						t.Errorf("%s: replica %d added with %+v: more than its name and models", p, i, spec)
					}
				}
				def := affinity.Config{}.WithDefaults()
				for k, in := range c.routers {
					for i, st := range in.router.Replicas() {
						trueRate := 1 / engines[i].Timing.PerPrefillToken.Seconds()
						if trueRate == def.DefaultPrefillTokensPerSec {
							t.Fatalf("engine rate equals the router default %v: the check below proves nothing", trueRate)
						}
						if st.PrefillTokensPerSec != def.DefaultPrefillTokensPerSec || st.BatchSlots != 0 {
							t.Errorf("%s router %d replica %d starts at %v tokens/s, %d slots: want the default %v and unknown",
								p, k, i, st.PrefillTokensPerSec, st.BatchSlots, def.DefaultPrefillTokensPerSec)
						}
					}
				}
			}
		})
	}
}

// TestSignalsAreScrapes: each replica is scraped before the first request
// is routed (the proxy scrapes a replica as its control loop starts), then
// on its own phase of the scrape interval, every interval, as vLLM's or
// llama.cpp's /metrics would give them (vLLM: KV capacity from cache_config_info; llama.cpp:
// slots from /props, no capacity).
func TestSignalsAreScrapes(t *testing.T) {
	w := smallShared(t, 40)
	engines, err := FleetEngines("vllm", 4)
	if err != nil {
		t.Fatal(err)
	}
	ll, err := FleetEngines("llamacpp", 4)
	if err != nil {
		t.Fatal(err)
	}
	engines[2], engines[3] = ll[2], ll[3]
	const every = 700 * time.Millisecond
	c, err := newCluster(Config{Replicas: 4, Engines: engines, ScrapeInterval: every}, w)
	if err != nil {
		t.Fatal(err)
	}
	at := make([][]int64, 4)
	c.onSignals = func(i int, s affinity.EngineSignals) {
		if len(at[i]) == 0 && (s.At != max(w.Requests[0].Arrival, 1) || c.res.Decisions != 0 || s.Running != 0 || s.Waiting != 0) {
			t.Errorf("replica %d first scraped at %d after %d decisions (%+v): want at the first arrival, %d, idle, before any decision",
				i, s.At, c.res.Decisions, s, w.Requests[0].Arrival)
		}
		at[i] = append(at[i], s.At)
		switch {
		case i < 2 && (s.KVCapacityTokens != engines[i].NumGPUBlocks*engines[i].BlockSize || s.BatchSlots != 0):
			t.Errorf("vLLM replica %d signals %+v: want its cache_config_info capacity and no slots", i, s)
		case i >= 2 && (s.KVCapacityTokens != 0 || s.BatchSlots != 4):
			t.Errorf("llama.cpp replica %d signals %+v: want 4 slots and no capacity", i, s)
		}
	}
	if err := c.loop(w); err != nil {
		t.Fatal(err)
	}
	phases := map[int64]bool{}
	for i, ts := range at {
		if len(ts) < 4 {
			t.Fatalf("replica %d scraped %d times", i, len(ts))
		}
		ts = ts[1:] // after the scrape at start, one per interval at the replica's phase
		for k := 1; k < len(ts); k++ {
			if ts[k]-ts[k-1] != int64(every) {
				t.Fatalf("replica %d scrapes at %d then %d: want every %v", i, ts[k-1], ts[k], every)
			}
		}
		phases[(ts[0]-w.Requests[0].Arrival)%int64(every)] = true
	}
	if len(phases) < 3 {
		t.Errorf("scrape phases %v: replicas scraped in lockstep", phases)
	}
}

// TestFirstScrapeAtTimeZero: a workload whose first request arrives at 0
// has its first scrape there too, and the routers take it (0 is their
// "never scraped"): llama.cpp servers are in slot mode before the first
// request, so the slot model sees every request from the first on. Taken
// as unscraped, a server switched to slot mode at its next scrape with an
// empty slot model, predicted no hit for anything, and got no traffic.
func TestFirstScrapeAtTimeZero(t *testing.T) {
	mt := workload.DefaultMultiTurn()
	mt.Seed, mt.Conversations, mt.MinTurns, mt.MaxTurns = 4, 4, 2, 3
	w, err := workload.MultiTurn(mt)
	if err != nil {
		t.Fatal(err)
	}
	if w.Requests[0].Arrival != 0 {
		t.Fatalf("first arrival %d: the case needs one at 0", w.Requests[0].Arrival)
	}
	engines, err := FleetEngines("llamacpp", 2)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newCluster(Config{Replicas: 2, Engines: engines}, w)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]bool, 2)
	c.onSignals = func(i int, s affinity.EngineSignals) {
		if seen[i] {
			return
		}
		seen[i] = true
		if st := c.routers[0].router.Replicas()[i]; !st.SlotCaches || st.Signals.At != s.At {
			t.Errorf("replica %d after its first scrape (at %d): slot caches %v, signals at %d; want its slot caches known and the scrape taken",
				i, s.At, st.SlotCaches, st.Signals.At)
		}
	}
	if err := c.loop(w); err != nil {
		t.Fatal(err)
	}
}

// TestTokenDensityVaries: the engine's usage (real tokens) differs from the
// router's bytes/4 estimate by a factor that varies per request, within
// its bounds, the same for a seed.
func TestTokenDensityVaries(t *testing.T) {
	var xs []float64
	for id := range 2000 {
		d := tokenDensity(7, id)
		if d != tokenDensity(7, id) || d < 0.7 || d > 1.3 {
			t.Fatalf("request %d: density %v (not deterministic or out of [0.7, 1.3])", id, d)
		}
		xs = append(xs, d)
	}
	slices.Sort(xs)
	med, p10, p90 := xs[1000], xs[200], xs[1800]
	if math.Abs(med-1/1.05) > 0.01 || p90-p10 < 0.15 {
		t.Errorf("density median %.3f (want ~0.952), p10 %.3f p90 %.3f (want a spread of ~0.24)", med, p10, p90)
	}
	if tokenDensity(7, 1) == tokenDensity(8, 1) {
		t.Error("density does not depend on the seed")
	}
}

// TestFleetsDeterministic: every fleet gives the same outcomes for a seed,
// and its engines are what it says.
func TestFleetsDeterministic(t *testing.T) {
	w := smallShared(t, 30)
	for _, f := range Fleets() {
		t.Run(f.Name, func(t *testing.T) {
			engines, err := FleetEngines(f.Name, 4)
			if err != nil {
				t.Fatal(err)
			}
			run := func() *Result {
				r, err := Run(Config{Replicas: 4, Engines: engines, Fleet: f.Name, Seed: 5, KeepOutcomes: true}, w)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			a, b := run(), run()
			a.DecideNanos, b.DecideNanos = 0, 0
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("two runs differ: %+v vs %+v", a.TTFT, b.TTFT)
			}
			if a.Completed == 0 || a.Fleet != f.Name {
				t.Fatalf("completed %d, fleet %q", a.Completed, a.Fleet)
			}
			// Each outcome carries the router's prediction and the
			// engine's first scheduling, in order with its arrival and
			// first token.
			for _, o := range a.Outcomes {
				if o.OK && (!(o.PredictedTTFT > 0) || o.Scheduled < o.Arrival || o.Scheduled > o.Arrival+o.TTFT || o.Busy < 0) {
					t.Fatalf("outcome %+v: prediction, busy count or scheduling out of order", o)
				}
			}
			switch f.Name {
			case "no-cache":
				if a.HitRate != 0 {
					t.Errorf("no prefix cache but hit rate %v", a.HitRate)
				}
			case "llamacpp":
				for _, e := range engines {
					if e.Slots != 4 {
						t.Fatalf("llama.cpp engine with %d slots", e.Slots)
					}
				}
			case "hetero":
				if engines[2].Timing.StepBase != 2*engines[0].Timing.StepBase || engines[3].Timing.PerPrefillToken != 3*engines[0].Timing.PerPrefillToken {
					t.Errorf("hetero timings %+v", engines[:4])
				}
			}
		})
	}
	if _, err := FleetEngines("nope", 2); err == nil {
		t.Error("unknown fleet accepted")
	}
	if _, err := Run(Config{Replicas: 3, Engines: make([]enginesim.Config, 2)}, w); err == nil {
		t.Error("2 engine configs for 3 replicas accepted")
	}
}
