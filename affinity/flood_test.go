package affinity

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestCacheBustingFlood: an attacker sends thousands of requests, each with
// a unique random prefix, while a well-behaved tenant keeps using one long
// system prompt. The index must stay within its configured bound (capacity
// blocks per replica) the whole time, the flood must really churn it
// (evictions), and the tenant's hot prefix must still be predicted cached at
// the end: the flood's one-off blocks are evicted before it. The index is
// LRU per replica, as engines' prefix caches are: a hot prefix survives while
// the flood's per-replica turnover between two of its uses stays below the
// replica's capacity (here 10 x 8 blocks spread over 3 replicas vs 128); at
// one use per 20-40 flood requests a few of the tenant's requests miss.
func TestCacheBustingFlood(t *testing.T) {
	const (
		replicas  = 3
		capBlocks = 128 // per replica
		floodN    = 5000
		hotEvery  = 10 // the tenant sends one request per 10 flood requests
	)
	r, _ := newTestRouter(t, Config{DefaultKVCapacityTokens: capBlocks * DefaultBlockTokens}, replicas)
	bound := replicas * capBlocks
	blockBytes := DefaultBlockTokens * DefaultBytesPerToken
	// 16 blocks of hot system prompt; flood prompts are 8 blocks of random text.
	hotSystem := strings.Repeat("You are the support bot of a well-behaved tenant. ", 16*blockBytes/50+1)
	rng := rand.New(rand.NewPCG(1, 2))
	randText := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a' + byte(rng.IntN(26))
		}
		return string(b)
	}
	var now int64
	run := func(body []byte) Decision {
		t.Helper()
		now += 10_000_000 // 100 requests/s, one at a time
		req := request(t, body, now)
		var d Decision
		if err := r.Decide(req, &d); err != nil {
			t.Fatalf("Decide: %v", err)
		}
		var f Flight
		r.Begin(d.Ranked[0], req, &d, &f)
		// Prefill at 10,000 tokens/s for the uncached part, then one token.
		first := now + int64(f.UncachedTokens)*100_000
		r.FirstToken(&f, first)
		r.End(&f, first+1_000_000, -1, true)
		now = first + 1_000_000
		if st := r.Stats(); st.TrackedPairs > bound || st.TrackedBlocks > bound {
			t.Fatalf("index over its bound: %d pairs, %d blocks, bound %d", st.TrackedPairs, st.TrackedBlocks, bound)
		}
		return d
	}
	hot := func(turn int) []byte { return chatBody("m", hotSystem, fmt.Sprintf("question %d", turn)) }
	want := 15 * DefaultBlockTokens // the 16 system blocks, give or take the boundary block
	run(hot(0))
	misses := 0
	for i := range floodN {
		run(chatBody("m", randText(8*blockBytes), "hi"))
		if i%hotEvery == hotEvery-1 {
			// The tenant's every request finds its prefix predicted cached.
			if d := run(hot(i)); slices.Max(d.CachedTokens) < want {
				misses++
			}
		}
	}
	st := r.Stats()
	if st.Evictions < floodN {
		t.Fatalf("only %d evictions: the flood did not churn the index", st.Evictions)
	}
	if misses > 0 {
		t.Fatalf("hot prefix predicted uncached on %d of %d tenant requests during the flood (evicted before the flood's one-off blocks)", misses, floodN/hotEvery)
	}
	for range hotEvery - 1 {
		run(chatBody("m", randText(8*blockBytes), "hi"))
	}
	d := run(hot(-1))
	best := slices.Max(d.CachedTokens)
	if best < want {
		t.Fatalf("hot prefix predicted %d cached tokens after the flood, want >= %d", best, want)
	}
	t.Logf("flood %d requests: %d pairs (bound %d), %d evictions, hot prefix %d tokens cached", floodN, st.TrackedPairs, bound, st.Evictions, best)
}

// TestSessionFlood: with the session policy, a flood of unique session keys
// (a fresh `user` or session header per request) keeps the session table
// within max_sessions, and a tenant's session pinned before the flood stays
// pinned to its replica throughout.
func TestSessionFlood(t *testing.T) {
	const maxSessions = 1000
	r, _ := newTestRouter(t, Config{Policy: "session", MaxSessions: maxSessions}, 3)
	sp, ok := r.policy.(*Session)
	if !ok {
		t.Fatalf("policy %T, want *Session", r.policy)
	}
	body := chatBody("m", "sys", "hello")
	var now int64
	run := func(key uint64) ReplicaID {
		t.Helper()
		now += 1_000_000
		req := request(t, body, now)
		req.SessionKey = key
		var d Decision
		if err := r.Decide(req, &d); err != nil {
			t.Fatalf("Decide: %v", err)
		}
		var f Flight
		r.Begin(d.Ranked[0], req, &d, &f)
		r.FirstToken(&f, now+100_000)
		r.End(&f, now+200_000, -1, true)
		if n := sp.Sessions(); n > maxSessions {
			t.Fatalf("session table at %d, bound %d", n, maxSessions)
		}
		return d.Ranked[0]
	}
	const tenant = 0xC0FFEE | 1
	home := run(tenant)
	for i := range 20 * maxSessions {
		run(uint64(i)<<1 | 1 + 2) // odd, never the tenant's key
		if i%50 == 0 {
			if got := run(tenant); got != home {
				t.Fatalf("after %d flood sessions the tenant moved from replica %d to %d", i, home, got)
			}
		}
	}
	if n := sp.Sessions(); n != maxSessions {
		t.Fatalf("session table at %d after the flood, want it full at %d (the flood really filled it)", n, maxSessions)
	}
}
