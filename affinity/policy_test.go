package affinity

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// state is a constructed router state: per replica in-flight requests (begun,
// never ended) and prefill rates; warm lists which replica holds which chain.
type state struct {
	n        int
	inFlight []int     // requests in flight per replica (each 1 block, past first token)
	pending  []int     // extra requests in prefill per replica, pendingTok tokens each
	rates    []float64 // prefill tokens/s; 0 = default
	slots    []int     // batch slots (ReplicaSpec.BatchSlots); 0 = unknown
}

const pendingTok = 4096

func buildRouter(t *testing.T, cfg Config, s state) (*Router, []ReplicaID) {
	t.Helper()
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]ReplicaID, s.n)
	for i := range s.n {
		spec := ReplicaSpec{Name: fmt.Sprintf("r%d", i), Models: []string{"m"}}
		if i < len(s.rates) {
			spec.PrefillTokensPerSec = s.rates[i]
		}
		if i < len(s.slots) {
			spec.BatchSlots = s.slots[i]
		}
		if ids[i], err = r.AddReplica(spec); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range s.inFlight {
		for range n {
			var f Flight
			r.Begin(ids[i], &Request{Model: []byte("m"), PromptTokens: 64, Hashes: []uint64{uint64(i)<<32 | 0xdead}}, nil, &f)
			r.FirstToken(&f, 0)
		}
	}
	for i, n := range s.pending {
		for range n {
			var f Flight
			r.Begin(ids[i], &Request{Model: []byte("m"), PromptTokens: pendingTok}, nil, &f)
		}
	}
	return r, ids
}

// warm marks req's prefix as cached on replica id (a completed request).
func warm(r *Router, id ReplicaID, req *Request) {
	var f Flight
	r.Begin(id, req, nil, &f)
	r.FirstToken(&f, req.Now)
	r.End(&f, req.Now, -1, true)
}

func decide(t *testing.T, r *Router, req *Request) Decision {
	t.Helper()
	var d Decision
	if err := r.Decide(req, &d); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return d
}

func promptReq(t *testing.T, system, user string) *Request {
	t.Helper()
	return request(t, chatBody("m", system, user), 1)
}

func TestPolicyChoices(t *testing.T) {
	sys8k := strings.Repeat("abcdefgh", 4096)   // 32 KiB = 8192 tokens
	sysSmall := strings.Repeat("abcdefgh", 256) // 2 KiB = 512 tokens
	sys16k := strings.Repeat("abcdefgh", 8192)  // 64 KiB = 16384 tokens
	tests := []struct {
		name   string
		cfg    Config
		state  state
		warm   map[int]string // replica -> system prompt cached there
		system string
		want   int // expected Ranked[0]
		not    int // or: expected never Ranked[0] (-1: unused)
	}{
		{name: "least-request picks fewest in flight", cfg: Config{Policy: "least-request"},
			state: state{n: 4, inFlight: []int{3, 1, 2, 5}}, system: "x", want: 1, not: -1},
		{name: "prefix picks longest match despite load", cfg: Config{Policy: "prefix"},
			state: state{n: 3, inFlight: []int{0, 9, 0}}, warm: map[int]string{1: sys8k, 2: sysSmall},
			system: sys8k, want: 1, not: -1},
		{name: "cost: warm replica beats idle cold ones", cfg: Config{},
			state: state{n: 4, inFlight: []int{0, 3, 0, 0}}, warm: map[int]string{1: sys8k},
			system: sys8k, want: 1, not: -1},
		{name: "cost: small shared prefix loses to load", cfg: Config{},
			state: state{n: 3, pending: []int{4, 0, 0}, inFlight: []int{0, 0, 1}}, warm: map[int]string{0: sysSmall},
			system: sysSmall, want: 1, not: -1},
		{name: "cost: no sharing behaves like least-loaded", cfg: Config{},
			state: state{n: 4, inFlight: []int{4, 2, 1, 3}}, system: "cold", want: 2, not: -1},
		{name: "cost: no sharing, pending prefill counts", cfg: Config{},
			state: state{n: 2, inFlight: []int{0, 2}, pending: []int{1, 0}}, system: "cold", want: 1, not: -1},
		{name: "cost: faster replica wins a long cold prompt", cfg: Config{},
			state: state{n: 2, rates: []float64{5000, 20000}}, system: sys8k, want: 1, not: -1},
		{name: "cost: a loaded home keeps its prefix while its queue is shorter than a recompute", cfg: Config{},
			// home r0 holds 16384 tokens (1.64 s to recompute) with 1.23 s of
			// prefill queued (3 requests): waiting there beats recomputing.
			state: state{n: 2, pending: []int{3, 0}}, warm: map[int]string{0: sys16k},
			system: sys16k, want: 0, not: -1},
		{name: "cost: a home queued past a recompute hands the prefix to an idle replica", cfg: Config{},
			// 7 requests (2.87 s) queued on the home: recomputing on an idle
			// replica costs 1.64 s and delays no one there.
			state: state{n: 8, pending: []int{7}}, warm: map[int]string{0: sys16k},
			system: sys16k, want: -1, not: 0},
		{name: "cost: a recompute is dearer where it joins a queue", cfg: Config{},
			// The home has 7 queued (2.87 s); every other replica has one
			// queued (0.41 s), which the 1.64 s recompute would delay: 0.41 +
			// 1.64 x (1 + 1) = 3.69 s. The home keeps the prefix.
			state: state{n: 8, pending: []int{7, 1, 1, 1, 1, 1, 1, 1}}, warm: map[int]string{0: sys16k},
			system: sys16k, want: 0, not: -1},
		{name: "cost: a hot prefix whose home has no free batch slot moves to a free one", cfg: Config{},
			// r0 holds the 2048-token prompt but runs 10 requests on 4 slots:
			// a new one waits for 7 of them to finish, each holding its slot
			// about 0.2 s (the warming request's measured slot time), 0.35 s;
			// recomputing the prompt on an idle replica costs 0.2 s. Without
			// the slot term the home won (its queue held no prefill).
			state: state{n: 3, inFlight: []int{10, 0, 0}, slots: []int{4, 4, 4}}, warm: map[int]string{0: sys8k[:8192]},
			system: sys8k[:8192], want: -1, not: 0},
		{name: "cost: the same home with a free slot keeps it", cfg: Config{},
			state: state{n: 3, inFlight: []int{3, 0, 0}, slots: []int{4, 4, 4}}, warm: map[int]string{0: sys8k[:8192]},
			system: sys8k[:8192], want: 0, not: -1},
		{name: "cost: a full home keeps a prefix that costs more to recompute than the slot wait", cfg: Config{},
			// 16384 tokens (1.64 s) vs one departure of four (0.41 s).
			state: state{n: 3, inFlight: []int{4, 0, 0}, slots: []int{4, 4, 4}}, warm: map[int]string{0: sys16k},
			system: sys16k, want: 0, not: -1},
		{name: "power-of-two never picks the most loaded first", cfg: Config{Policy: "power-of-two"},
			state: state{n: 4, inFlight: []int{1, 2, 9, 3}}, system: "x", want: -1, not: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ids := buildRouter(t, tt.cfg, tt.state)
			for i, sys := range tt.warm {
				warm(r, ids[i], promptReq(t, sys, "earlier question"))
			}
			req := promptReq(t, tt.system, "new question")
			for range 50 {
				d := decide(t, r, req)
				if tt.want >= 0 && d.Ranked[0] != ids[tt.want] {
					t.Fatalf("ranked %v (cached %v), want %d first; loads %+v", d.Ranked, d.CachedTokens, tt.want, r.Replicas())
				}
				if tt.not >= 0 && d.Ranked[0] == ids[tt.not] {
					t.Fatalf("ranked %v, %d must not be first", d.Ranked, tt.not)
				}
				if len(d.Ranked) != min(3, tt.state.n) || hasDup(d.Ranked) {
					t.Fatalf("ranked %v: want %d distinct", d.Ranked, min(3, tt.state.n))
				}
			}
		})
	}
}

func hasDup(ids []ReplicaID) bool {
	s := slices.Clone(ids)
	slices.Sort(s)
	return len(slices.Compact(s)) != len(ids)
}

func TestRoundRobin(t *testing.T) {
	r, ids := buildRouter(t, Config{Policy: "round-robin"}, state{n: 4})
	req := promptReq(t, "s", "u")
	seen := map[ReplicaID]int{}
	for range 8 {
		seen[decide(t, r, req).Ranked[0]]++
	}
	for _, id := range ids {
		if seen[id] != 2 {
			t.Fatalf("rotation %v", seen)
		}
	}
}

func TestConsistentHashStable(t *testing.T) {
	r, _ := buildRouter(t, Config{Policy: "consistent-hash"}, state{n: 8})
	homes := map[ReplicaID]bool{}
	for i := range 40 {
		req := promptReq(t, fmt.Sprintf("system prompt number %d ", i)+strings.Repeat("z", 300), "u")
		first := decide(t, r, req).Ranked[0]
		for range 5 {
			if got := decide(t, r, req).Ranked[0]; got != first {
				t.Fatalf("prefix %d moved from %d to %d without load", i, first, got)
			}
		}
		homes[first] = true
	}
	if len(homes) < 4 {
		t.Fatalf("40 prefixes landed on %d of 8 replicas", len(homes))
	}
	// Bounded load: overload the home, the prefix moves; unload, it returns.
	req := promptReq(t, strings.Repeat("y", 600), "u")
	home := decide(t, r, req).Ranked[0]
	var fs []Flight
	for range 10 {
		var f Flight
		r.Begin(home, &Request{Model: []byte("m"), PromptTokens: 1}, nil, &f)
		fs = append(fs, f)
	}
	if got := decide(t, r, req).Ranked[0]; got == home {
		t.Fatalf("home %d with 10 of 10 in flight still chosen (bound 1.25x mean)", home)
	}
	for i := range fs {
		r.End(&fs[i], 2, -1, true)
	}
	if got := decide(t, r, req).Ranked[0]; got != home {
		t.Fatalf("home %d not restored: %d", home, got)
	}
}

// TestCostNoColdPile: cold requests spread over idle replicas rather than
// piling onto one, both when each is begun (load feedback) and when many are
// decided before any Begin (random ties).
func TestCostNoColdPile(t *testing.T) {
	r, ids := buildRouter(t, Config{}, state{n: 8})
	seen := map[ReplicaID]bool{}
	for i := range 8 {
		req := promptReq(t, fmt.Sprintf("cold %d", i), "u")
		d := decide(t, r, req)
		var f Flight
		r.Begin(d.Ranked[0], req, &d, &f)
		seen[d.Ranked[0]] = true
	}
	if len(seen) != len(ids) {
		t.Fatalf("8 cold requests with Begin used %d of 8 replicas", len(seen))
	}
	r2, _ := buildRouter(t, Config{}, state{n: 8})
	seen = map[ReplicaID]bool{}
	req := promptReq(t, "cold", "u")
	for range 64 {
		seen[decide(t, r2, req).Ranked[0]] = true
	}
	if len(seen) < 4 {
		t.Fatalf("64 decisions on idle replicas used %d of 8", len(seen))
	}
}

func TestSessionPolicy(t *testing.T) {
	cfg := Config{Policy: "session", SessionTTL: time.Second}
	r, ids := buildRouter(t, cfg, state{n: 4, inFlight: []int{0, 1, 1, 1}})
	req := promptReq(t, "s", "u")
	req.SessionKey = 42
	d := decide(t, r, req)
	if d.Ranked[0] != ids[0] {
		t.Fatalf("new session: %v, want least-request %d", d.Ranked, ids[0])
	}
	// Pin the session on replica 2 (e.g. a retry went there).
	var f Flight
	r.Begin(ids[2], req, &d, &f)
	r.End(&f, 1, -1, true)
	steps := []struct {
		name string
		now  int64
		prep func()
		want ReplicaID
	}{
		{"pinned", 2, func() {}, ids[2]},
		{"pinned despite load", 3, func() {
			var g Flight
			r.Begin(ids[2], &Request{Model: []byte("m"), PromptTokens: 1}, nil, &g)
		}, ids[2]},
		{"unhealthy pin falls back", 4, func() { r.SetHealthy(ids[2], false) }, ids[0]},
		{"healthy again", 5, func() { r.SetHealthy(ids[2], true) }, ids[2]},
		{"expired", int64(3 * time.Second), func() {}, ids[0]},
	}
	for _, s := range steps {
		s.prep()
		req.Now = s.now
		if got := decide(t, r, req); got.Ranked[0] != s.want || hasDup(got.Ranked) {
			t.Fatalf("%s: ranked %v, want %d first", s.name, got.Ranked, s.want)
		}
	}
	// Removal unpins.
	req.Now = 10
	r.Begin(ids[3], req, &d, &f)
	r.RemoveReplica(ids[3])
	id, err := r.AddReplica(ReplicaSpec{Name: "new", Models: []string{"m"}})
	if err != nil || id != ids[3] {
		t.Fatalf("id reuse: %v %v", id, err)
	}
	for range 3 { // load the new replica so a stale pin would stand out
		var g Flight
		r.Begin(id, &Request{Model: []byte("m"), PromptTokens: 1}, nil, &g)
	}
	if got := decide(t, r, req); got.Ranked[0] == id {
		t.Fatalf("stale pin to a reused id: %v", got.Ranked)
	}
}

// A scrape's waiting requests that were this router's own are not someone
// else's traffic once they have had their first token: an engine that
// reported this router's three queued requests, all since served, is as
// idle as its neighbour until the next scrape, not three prefills dearer.
// Waiting requests the router did not have pending at the scrape still
// count (TestSignals).
func TestServedWaitingIsNotQueued(t *testing.T) {
	cfg := Config{SignalMaxAge: 2 * time.Second}
	r, ids := buildRouter(t, cfg, state{n: 2})
	at := int64(10 * time.Second)
	for i, id := range ids {
		w := promptReq(t, strings.Repeat(string(rune('q'+i)), 4096), "u")
		w.Now = at
		warm(r, id, w)
	}
	var fs [3]Flight
	for i := range fs {
		q := promptReq(t, fmt.Sprintf("burst %d %s", i, strings.Repeat("z", 4096)), "u")
		q.Now = at
		r.Begin(ids[0], q, nil, &fs[i])
	}
	r.SetSignals(ids[0], EngineSignals{Waiting: 3, Running: 0, At: at})
	r.SetSignals(ids[1], EngineSignals{Waiting: 0, Running: 0, At: at})
	for i := range fs {
		r.FirstToken(&fs[i], at+int64(50*time.Millisecond))
		r.End(&fs[i], at+int64(60*time.Millisecond), -1, true)
	}
	req := promptReq(t, "cold", "u")
	req.Now = at + int64(100*time.Millisecond)
	seen := map[ReplicaID]int{}
	for range 60 {
		seen[decide(t, r, req).Ranked[0]]++
	}
	if seen[ids[0]] == 0 || seen[ids[1]] == 0 {
		t.Fatalf("two idle replicas, picks %v: the served requests still count as queued", seen)
	}
}

func TestSignals(t *testing.T) {
	cfg := Config{SignalMaxAge: time.Second}
	r, ids := buildRouter(t, cfg, state{n: 2})
	req := promptReq(t, "cold", "u")
	req.Now = int64(10 * time.Second)
	// Replica 0 reports a long engine queue (another router's traffic).
	r.SetSignals(ids[0], EngineSignals{Waiting: 50, Running: 100, At: int64(9500 * time.Millisecond)})
	r.SetSignals(ids[1], EngineSignals{Waiting: 0, Running: 0, At: int64(9500 * time.Millisecond)})
	// Give the replica a mean uncached size so waiting requests weigh.
	warm(r, ids[0], promptReq(t, strings.Repeat("q", 4096), "u"))
	warm(r, ids[1], promptReq(t, strings.Repeat("r", 4096), "u"))
	if d := decide(t, r, req); d.Ranked[0] != ids[1] {
		t.Fatalf("fresh signals ignored: %v", d.Ranked)
	}
	// Stale: both look idle, ties random: replica 0 must win sometimes.
	req.Now = int64(20 * time.Second)
	seen := map[ReplicaID]bool{}
	for range 40 {
		seen[decide(t, r, req).Ranked[0]] = true
	}
	if !seen[ids[0]] {
		t.Fatal("stale signals still trusted")
	}
	// KV pressure with fresh signals.
	r.SetSignals(ids[0], EngineSignals{KVUsage: 0.99, At: req.Now})
	r.SetSignals(ids[1], EngineSignals{KVUsage: 0.5, At: req.Now})
	for range 20 {
		if d := decide(t, r, req); d.Ranked[0] != ids[1] {
			t.Fatalf("KV pressure ignored: %v", d.Ranked)
		}
	}
	// Signalled KV capacity sizes the index.
	r.SetSignals(ids[0], EngineSignals{KVCapacityTokens: 640, At: req.Now})
	if st := r.Replicas(); st[0].CapacityBlocks != 10 {
		t.Fatalf("capacity %d blocks, want 10", st[0].CapacityBlocks)
	}
}

func TestPolicyRegistry(t *testing.T) {
	names := PolicyNames()
	if names[0] != DefaultPolicy || len(names) != 7 {
		t.Fatalf("names %v", names)
	}
	for _, n := range names {
		p, err := NewPolicy(n, Config{})
		if err != nil || p.Name() != n {
			t.Fatalf("NewPolicy(%q): %v %v", n, p, err)
		}
	}
	if _, err := NewPolicy("nope", Config{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		err  string
	}{
		{"zero is valid", Config{}, ""},
		{"unknown policy", Config{Policy: "x"}, `policy "x"`},
		{"block tokens", Config{Hash: HashConfig{BlockTokens: -1}}, "hash.block_tokens -1"},
		{"max ranked", Config{MaxRanked: 100}, "max_ranked 100: want 1..64"},
		{"load factor", Config{LoadFactor: 0.5}, "load_factor 0.5"},
		{"kv high water", Config{KVHighWater: 1.5}, "kv_high_water 1.5"},
		{"prompt cap", Config{Hash: HashConfig{MaxPromptBytes: 10}}, "hash.max_prompt_bytes 10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (tt.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
			_, nerr := NewRouter(tt.cfg)
			if (err == nil) != (nerr == nil) {
				t.Fatalf("NewRouter err %v, Validate %v", nerr, err)
			}
		})
	}
	if !errors.Is(ErrBadRequest, ErrBadRequest) {
		t.Fatal()
	}
}

// TestSessionSweep: expired sessions are swept incrementally, so the table
// stays near the live set, and a full table refuses new pins.
func TestSessionSweep(t *testing.T) {
	cfg := Config{Policy: "session", SessionTTL: time.Second, MaxSessions: 1000}
	r, ids := buildRouter(t, cfg, state{n: 2})
	s := r.policy.(*Session)
	var f Flight
	req := &Request{Model: []byte("m"), PromptTokens: 1}
	for i := range 1000 { // fill at t=0
		req.SessionKey, req.Now = uint64(i+1), 0
		r.Begin(ids[0], req, nil, &f)
		r.End(&f, 0, -1, true)
	}
	if s.Sessions() != 1000 {
		t.Fatalf("%d sessions, want 1000", s.Sessions())
	}
	req.SessionKey, req.Now = 5000, 1 // full: not pinned
	r.Begin(ids[1], req, nil, &f)
	r.End(&f, 1, -1, true)
	if s.Sessions() != 1000 {
		t.Fatalf("full table grew to %d", s.Sessions())
	}
	// Much later, 500 new sessions: the old 1000 are expired and swept.
	for i := range 500 {
		req.SessionKey, req.Now = uint64(10000+i), int64(10*time.Second)
		r.Begin(ids[1], req, nil, &f)
		r.End(&f, req.Now, -1, true)
	}
	if n := s.Sessions(); n > 700 {
		t.Fatalf("%d sessions after expiry, want near 500", n)
	}
	req.SessionKey = 10000
	if d := decide(t, r, req); d.Ranked[0] != ids[1] {
		t.Fatalf("live session lost: %v", d.Ranked)
	}
}

// TestCostNoHarm: with zero prefix sharing and equal replicas, the cost
// policy's first choice always has the fewest requests in flight, over many
// random load states (pending prefill proportional to requests waiting).
func TestCostNoHarm(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 40 {
		n := 2 + rng.IntN(7)
		s := state{n: n, inFlight: make([]int, n), pending: make([]int, n)}
		for i := range n {
			s.inFlight[i] = rng.IntN(6)
			s.pending[i] = rng.IntN(3)
		}
		r, ids := buildRouter(t, Config{}, s)
		req := promptReq(t, fmt.Sprintf("cold %d ", trial)+strings.Repeat("z", 3000), "u")
		d := decide(t, r, req)
		load := func(id ReplicaID) (int, int) {
			for i := range ids {
				if ids[i] == id {
					return s.pending[i], s.pending[i] + s.inFlight[i]
				}
			}
			return -1, -1
		}
		bp, bt := load(d.Ranked[0])
		for i := range ids {
			if s.pending[i] < bp || (s.pending[i] == bp && s.pending[i]+s.inFlight[i] < bt) {
				t.Fatalf("trial %d: picked %d (pending %d, busy %d) over %d (pending %d, busy %d)",
					trial, d.Ranked[0], bp, bt, i, s.pending[i], s.pending[i]+s.inFlight[i])
			}
		}
	}
}

// TestCostSample: above MaxScan candidates the cost policy scores a random
// window plus every prefix holder: a holder is never missed, and the window
// still finds idle replicas when half of them are idle.
func TestCostSample(t *testing.T) {
	const n = 300
	s := state{n: n, inFlight: make([]int, n)}
	for i := range n {
		if i%2 == 1 {
			s.inFlight[i] = 3
		}
	}
	r, ids := buildRouter(t, Config{}, s) // MaxScan 128 by default
	if r.Config().MaxScan != DefaultMaxScan || DefaultMaxScan >= n {
		t.Fatalf("MaxScan %d", r.Config().MaxScan)
	}
	for i := range 50 {
		req := promptReq(t, fmt.Sprintf("cold %d", i), "u")
		if first := decide(t, r, req).Ranked[0]; s.inFlight[first] != 0 {
			t.Fatalf("picked busy replica %d", first)
		}
	}
	sys := strings.Repeat("abcdefgh", 4096) // 8192 tokens
	warm(r, ids[n-2], promptReq(t, sys, "earlier"))
	req := promptReq(t, sys, "now")
	for range 50 {
		if first := decide(t, r, req).Ranked[0]; first != ids[n-2] {
			t.Fatalf("prefix holder %d missed: picked %d", ids[n-2], first)
		}
	}
}

// TestCostSampleBoundsHolders: with a prefix every replica holds (a
// system prompt the whole fleet has served), the cost policy scores at
// most 2 MaxScan candidates, not the fleet, and among them every replica
// holding more of the prompt than that: the 3 deepest holders always,
// then a random draw of the 40 at the middle depth (every one of them
// drawn over many decisions), never a replica with the system prompt
// alone in their place.
func TestCostSampleBoundsHolders(t *testing.T) {
	const n, k = 300, 16
	r, ids := buildRouter(t, Config{MaxScan: k}, state{n: n})
	req := promptReq(t, strings.Repeat("abcdefgh", 4096), "question") // 8,192 tokens, 128 blocks
	hs := req.Hashes
	part := func(blocks int) *Request { q := *req; q.Hashes = hs[:blocks]; return &q }
	for _, id := range ids {
		warm(r, id, part(8))
	}
	mid, deep := map[ReplicaID]bool{}, map[ReplicaID]bool{}
	for i := range 40 {
		mid[ids[7*i+3]] = true
		warm(r, ids[7*i+3], part(64))
	}
	for _, i := range []int{5, 151, 299} { // none of them a middle holder
		deep[ids[i]] = true
		warm(r, ids[i], part(120))
	}
	seen := map[ReplicaID]bool{}
	var d Decision
	for trial := range 1000 {
		if err := r.Decide(req, &d); err != nil {
			t.Fatal(err)
		}
		cands := d.view.cands
		if len(cands) > 2*k {
			t.Fatalf("trial %d: %d candidates scored, want at most %d", trial, len(cands), 2*k)
		}
		nDeep, nMid := 0, 0
		for _, id := range cands {
			switch {
			case deep[id]:
				nDeep++
			case mid[id]:
				nMid++
				seen[id] = true
			}
		}
		if nDeep != len(deep) || nMid < k-len(deep) {
			t.Fatalf("trial %d: scored %d of %d deepest and %d middle holders, want all and at least %d",
				trial, nDeep, len(deep), nMid, k-len(deep))
		}
		if !deep[d.Ranked[0]] {
			t.Fatalf("trial %d: picked %d, not a deepest holder", trial, d.Ranked[0])
		}
	}
	if len(seen) != len(mid) {
		t.Fatalf("%d of the %d middle holders ever scored", len(seen), len(mid))
	}
}

// TestKthLargest: the quickselect agrees with a sort, repeats and all.
func TestKthLargest(t *testing.T) {
	var v View
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		a := make([]int32, 1+rng.IntN(60))
		span := 1 + rng.IntN(8) // few distinct values, as holders' depths
		for i := range a {
			a[i] = int32(rng.IntN(span))
		}
		want := slices.Clone(a)
		slices.Sort(want)
		slices.Reverse(want)
		k := 1 + rng.IntN(len(a))
		if got := kthLargest(a, k, &v); got != want[k-1] {
			t.Fatalf("trial %d: %d-th largest of %v = %d, want %d", trial, k, want, got, want[k-1])
		}
	}
}

// TestKVPenaltyCountsTheRequest: the KV penalty prices the usage an engine
// would be at with the request's uncached tokens in its cache, as a share
// of the KV capacity it reports: of two cold replicas at the same usage,
// the one whose cache the prompt would overfill is left alone, where
// usage alone tied them; an engine that reports no capacity is priced on
// its usage as before.
func TestKVPenaltyCountsTheRequest(t *testing.T) {
	r, ids := newTestRouter(t, Config{Policy: "cost"}, 2)
	req := promptReq(t, strings.Repeat("abcdefgh", 2048), "u") // 4,096 tokens, cached nowhere
	req.Now = int64(10 * time.Second)
	// 0.85 + 0.25 on replica 0, + 0.004 on replica 1
	r.SetSignals(ids[0], EngineSignals{KVUsage: 0.85, KVCapacityTokens: 16384, At: req.Now})
	r.SetSignals(ids[1], EngineSignals{KVUsage: 0.85, KVCapacityTokens: 1 << 20, At: req.Now})
	for range 20 {
		if d := decide(t, r, req); d.Ranked[0] != ids[1] {
			t.Fatalf("the prompt's share of a small KV cache ignored: %v", d.Ranked)
		}
	}
	r2, ids2 := newTestRouter(t, Config{Policy: "cost"}, 2)
	for _, id := range ids2 {
		r2.SetSignals(id, EngineSignals{KVUsage: 0.85, At: req.Now})
	}
	seen := map[ReplicaID]bool{}
	for range 40 {
		seen[decide(t, r2, req).Ranked[0]] = true
	}
	if len(seen) != 2 {
		t.Fatalf("no capacity reported: usage 0.85 on both should tie, chose only %v", seen)
	}
}
