package affinity

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestCostKeepsChatHome: a chat's next turn carries the previous answer,
// which the engine cached but the router never hashed (it only inserts prompt
// blocks). The index alone sees the conversation's replica ahead of a replica
// holding just the shared system prompt by one block (64 tokens, 6.4 ms at
// the default 10000 tokens/s), less than two busy requests cost (10 ms), so
// the turn would move and recompute the answer. The engines' reports teach
// the router what continuing a finished prompt is worth; with that credit the
// turn stays home. Where the engines report no such surplus there is no
// credit and the busy term decides as before.
func TestCostKeepsChatHome(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 142)[:4096] // 1024 tokens
	question := func(c, k int) string { return fmt.Sprintf("%-384s", fmt.Sprintf("conversation %d question %d", c, k)) }
	answer := func(c, k int) string { return fmt.Sprintf("%-640s", fmt.Sprintf("conversation %d answer %d", c, k)) } // 160 tokens
	turn0 := func(c int) *Request { return request(t, chatBody("m", sys, question(c, 0)), 1) }
	turn1 := func(c int) *Request {
		return request(t, chatBody("m", sys, question(c, 0), answer(c, 0), question(c, 1)), 2)
	}
	for _, tc := range []struct {
		name       string
		answerKept bool // engines report the previous answer cached
		wantHome   bool
	}{
		{"engines cache the answer: the turn stays home", true, true},
		{"no surplus reported: no credit, the busy term decides", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ids := newTestRouter(t, Config{}, 2)
			home, other := ids[0], ids[1]
			end := func(id ReplicaID, req *Request, cached func(f *Flight) int) {
				t.Helper()
				var f Flight
				r.Begin(id, req, nil, &f)
				r.End(&f, req.Now, cached(&f), true)
			}
			predicted := func(f *Flight) int { return f.PromptTokens - f.UncachedTokens }
			// Conversations 1..5 run two turns on home; the engine reports
			// the second turn's cached tokens.
			for c := 1; c <= 5; c++ {
				end(home, turn0(c), predicted)
				end(home, turn1(c), func(f *Flight) int {
					if !tc.answerKept {
						return predicted(f)
					}
					return f.PromptTokens - 97 // all but the new question
				})
			}
			credit := r.ContinuationCredit()
			if tc.answerKept && (credit < 150 || credit > 250) || !tc.answerKept && credit != 0 {
				t.Fatalf("continuation credit %.0f tokens", credit)
			}
			gauge := scrape(t, prometheusRegistry(t, r), []string{"warmpath_affinity_continuation_credit_tokens"})
			if !strings.Contains(gauge, fmt.Sprintf("warmpath_affinity_continuation_credit_tokens %g\n", credit)) {
				t.Fatalf("metric:\n%s\nwant %g", gauge, credit)
			}
			// The other replica holds the system prompt; home holds
			// conversation 9's first turn and two more busy requests.
			end(other, turn0(8), predicted)
			end(home, turn0(9), predicted)
			for i := range 2 {
				var f Flight
				r.Begin(home, &Request{Model: []byte("m"), PromptTokens: 64, Hashes: []uint64{0xb0 + uint64(i)}}, nil, &f)
				r.FirstToken(&f, 1)
			}
			req := turn1(9)
			d := decide(t, r, req)
			if got := d.Ranked[0] == home; got != tc.wantHome {
				t.Fatalf("ranked %v (cached %v), want home first: %v", d.Ranked, d.CachedTokens, tc.wantHome)
			}
			if d.CachedTokens[slices.Index(d.Ranked, home)] != 17*64 {
				t.Fatalf("cached %v: the index prediction must not include the credit", d.CachedTokens)
			}
			// The turn's predicted prefill on home (its pending work and
			// TTFT prediction) takes the credit off, as the decision did.
			var f Flight
			r.Begin(home, req, &d, &f)
			defer r.End(&f, req.Now, -1, true)
			index := req.PromptTokens - 17*64
			if tc.answerKept && f.UncachedTokens > index-int(credit)+8 || !tc.answerKept && f.UncachedTokens != index {
				t.Fatalf("predicted uncached %d tokens on home: the index leaves %d, the credit is %.0f", f.UncachedTokens, index, credit)
			}
		})
	}
}

// TestContinuationOnlyAfterSuccess: a failed request leaves no finished tail,
// so the next prompt extending it gets no credit.
func TestContinuationOnlyAfterSuccess(t *testing.T) {
	r, ids := newTestRouter(t, Config{}, 1)
	req := request(t, chatBody("m", strings.Repeat("x", 4096), "q"), 1)
	var f Flight
	r.Begin(ids[0], req, nil, &f)
	r.FirstToken(&f, 1)
	r.End(&f, 2, -1, false)
	if r.finishedTail(req.Hashes[len(req.Hashes)-1], ids[0]) {
		t.Fatal("a failed request marked its tail finished")
	}
	r.Begin(ids[0], req, nil, &f)
	r.End(&f, 3, -1, true)
	if !r.finishedTail(req.Hashes[len(req.Hashes)-1], ids[0]) {
		t.Fatal("a finished request did not mark its tail")
	}
}
