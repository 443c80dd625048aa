package sim

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/workload"
)

func smallShared(t *testing.T, rps float64) *workload.Workload {
	t.Helper()
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.RPS, c.Seed = 16, 8, rps, 3
	w, err := workload.SharedPrefix(c)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestDeterministicForSeed(t *testing.T) {
	w := smallShared(t, 40)
	for _, p := range []string{"cost", "random", "power-of-two", "sglang-cache-aware", "llm-d", "dynamo-kv"} {
		t.Run(p, func(t *testing.T) {
			a, err := Run(Config{Replicas: 4, Policy: p, Seed: 9, KeepOutcomes: true}, w)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Run(Config{Replicas: 4, Policy: p, Seed: 9, KeepOutcomes: true}, w)
			if err != nil {
				t.Fatal(err)
			}
			a.DecideNanos, b.DecideNanos = 0, 0
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("same seed, different results:\n%+v\n%+v", a, b)
			}
		})
	}
}

func TestConservesRequests(t *testing.T) {
	mt := workload.DefaultMultiTurn()
	mt.Conversations, mt.Seed = 10, 1
	multi, _ := workload.MultiTurn(mt)
	mx := workload.DefaultMixed()
	mx.Requests = 200
	mixed, _ := workload.Mixed(mx)
	for _, w := range []*workload.Workload{smallShared(t, 200), multi, mixed} {
		for _, p := range Policies() {
			t.Run(w.Name+"/"+p.Name, func(t *testing.T) {
				r, err := Run(Config{Replicas: 3, Policy: p.Name, KeepOutcomes: true}, w)
				if err != nil {
					t.Fatal(err)
				}
				seen := make(map[int]bool, len(r.Outcomes))
				for _, o := range r.Outcomes {
					if seen[o.ID] {
						t.Fatalf("request %d finished twice", o.ID)
					}
					seen[o.ID] = true
				}
				if len(seen) != len(w.Requests) {
					t.Fatalf("%d of %d requests finished", len(seen), len(w.Requests))
				}
				if r.Completed+r.Failed != len(w.Requests) || r.Failed != 0 {
					t.Fatalf("offered %d, completed %d, failed %d", len(w.Requests), r.Completed, r.Failed)
				}
				if r.TTFT.P50 <= 0 || r.TTFT.P99 < r.TTFT.P50 || r.E2E.Mean < r.TTFT.Mean {
					t.Fatalf("implausible latencies %+v", r)
				}
			})
		}
	}
}

// Two requests with the same 4096-token system prompt, far apart, on one
// idle replica: the second one's TTFT is shorter by exactly the prefill cost
// of the cached blocks, per the engine's step model.
func TestCachedPrefixTTFTMatchesModel(t *testing.T) {
	mk := func(id int, at time.Duration) workload.Request {
		return workload.Request{ID: id, Arrival: int64(at), Model: workload.DefaultModel, OutputTokens: 1, Group: 0, Conversation: -1,
			Messages: []workload.Message{
				{Role: workload.System, Segments: []workload.Segment{{ID: 1, Tokens: 4096}}},
				{Role: workload.User, Segments: []workload.Segment{{ID: uint64(100 + id), Tokens: 64}}},
			}}
	}
	w := &workload.Workload{Name: "two", Requests: []workload.Request{mk(0, 0), mk(1, 10*time.Second)}}
	cfg := enginesim.DefaultConfig()
	cfg.MaxNumBatchedTokens = 1 << 16 // one prefill step per request
	r, err := Run(Config{Replicas: 1, Engine: cfg, KeepOutcomes: true}, w)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Outcomes) != 2 {
		t.Fatalf("got %d outcomes", len(r.Outcomes))
	}
	first, second := r.Outcomes[0], r.Outcomes[1]
	if first.CachedTokens != 0 || second.CachedTokens < 4096-cfg.BlockSize {
		t.Fatalf("cached tokens %d then %d, want 0 then the shared prefix", first.CachedTokens, second.CachedTokens)
	}
	if second.Predicted < 4096-affinityBlock || second.Predicted > second.CachedTokens+affinityBlock {
		t.Fatalf("router predicted %d cached tokens, engine had %d", second.Predicted, second.CachedTokens)
	}
	// Both prefill in one step with no other sequence: the TTFT difference is
	// exactly the per-token prefill cost of the cached tokens plus the
	// attention pairs they save (enginesim's quadratic term).
	attn := func(c, n int) time.Duration {
		return time.Duration((int64(n)*int64(c) + int64(n)*int64(n+1)/2) * int64(cfg.Timing.PerPrefillKPairs) / 1000)
	}
	c2 := second.CachedTokens
	saved := time.Duration(c2)*cfg.Timing.PerPrefillToken + attn(0, first.PromptTokens) - attn(c2, second.PromptTokens-c2)
	want := saved.Seconds()
	if got := first.TTFT - second.TTFT; math.Abs(got-want) > 1e-9 {
		t.Fatalf("TTFT saved %.9fs, model says %.9fs (%d cached tokens)", got, want, second.CachedTokens)
	}
}

const affinityBlock = 64

func TestBadConfig(t *testing.T) {
	w := smallShared(t, 10)
	if _, err := Run(Config{Replicas: -1}, w); err == nil {
		t.Fatal("negative replicas accepted")
	}
	if _, err := Run(Config{Policy: "nope"}, w); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := Run(Config{}, &workload.Workload{}); err == nil {
		t.Fatal("empty workload accepted")
	}
	for _, c := range []Config{{Routers: -1}, {Routers: 257}, {Routers: 2, Sync: true, SyncDelay: -time.Millisecond}} {
		if _, err := Run(c, w); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// Multi-turn chats run closed loop: a turn arrives after the previous one
// finished, and carries the engine's real answer, whose cached blocks the
// next turn reuses.
func TestMultiTurnClosedLoop(t *testing.T) {
	c := workload.MultiTurnConfig{Conversations: 1, MinTurns: 4, MaxTurns: 4, SharedTokens: 512, QuestionTokens: 64,
		AnswerTokens: 200, ThinkSeconds: 0.001, ConversationRPS: 1, Seed: 5}
	w, err := workload.MultiTurn(c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(Config{Replicas: 1, KeepOutcomes: true}, w)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Outcomes) != 4 {
		t.Fatalf("%d outcomes", len(r.Outcomes))
	}
	for k := 1; k < 4; k++ {
		prev, cur := r.Outcomes[k-1], r.Outcomes[k]
		if cur.Arrival < prev.Finish {
			t.Fatalf("turn %d arrived at %.4f before turn %d finished at %.4f", k, cur.Arrival, k-1, prev.Finish)
		}
		// the previous prompt and most of the previous answer are cached
		if cur.CachedTokens <= prev.PromptTokens+200-32 {
			t.Fatalf("turn %d: %d cached tokens, previous prompt %d + answer 200", k, cur.CachedTokens, prev.PromptTokens)
		}
	}
}
