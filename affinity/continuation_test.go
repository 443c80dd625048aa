package affinity

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// chatTurn is conversation c's turn k (0 or 1) of a chat with a 1024-token
// system prompt, 96-token questions and 160-token answers.
func chatTurn(t *testing.T, c, k int) *Request {
	t.Helper()
	sys := strings.Repeat("You are a helpful assistant. ", 142)[:4096]
	question := func(k int) string { return fmt.Sprintf("%-384s", fmt.Sprintf("conversation %d question %d", c, k)) }
	answer := func(k int) string { return fmt.Sprintf("%-640s", fmt.Sprintf("conversation %d answer %d", c, k)) }
	if k == 0 {
		return request(t, chatBody("m", sys, question(0)), 1)
	}
	return request(t, chatBody("m", sys, question(0), answer(0), question(1)), 2)
}

// learnCredit runs conversations 1..5 through two turns on home, the
// engines reporting each second turn's answer cached when answerKept (the
// router learns the continuation credit) or only the predicted hit; then
// conversation 8's first turn on other (which so holds the system prompt)
// and 9's on home.
func learnCredit(t *testing.T, r *Router, home, other ReplicaID, answerKept bool) {
	t.Helper()
	end := func(id ReplicaID, req *Request, cached func(f *Flight) int) {
		var f Flight
		r.Begin(id, req, nil, &f)
		r.End(&f, req.Now, cached(&f), true)
	}
	predicted := func(f *Flight) int { return f.PromptTokens - f.UncachedTokens }
	for c := 1; c <= 5; c++ {
		end(home, chatTurn(t, c, 0), predicted)
		end(home, chatTurn(t, c, 1), func(f *Flight) int {
			if !answerKept {
				return predicted(f)
			}
			return f.PromptTokens - 97 // all but the new question
		})
	}
	end(other, chatTurn(t, 8, 0), predicted)
	end(home, chatTurn(t, 9, 0), predicted)
}

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
			learnCredit(t, r, home, other, tc.answerKept)
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
			for i := range 2 {
				var f Flight
				r.Begin(home, &Request{Model: []byte("m"), PromptTokens: 64, Hashes: []uint64{0xb0 + uint64(i)}}, nil, &f)
				r.FirstToken(&f, 1)
			}
			req := chatTurn(t, 9, 1)
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
	r, ids := newTestRouter(t, Config{}, 2)
	req := request(t, chatBody("m", strings.Repeat("x", 4096), "q"), 1)
	var f Flight
	r.Begin(ids[0], req, nil, &f)
	r.FirstToken(&f, 1)
	r.End(&f, 2, -1, false)
	if r.finishedTail(req.Hashes[len(req.Hashes)-1], ids[0]) {
		t.Fatal("a failed request marked its tail finished")
	}
	// the failed request's blocks stay indexed (it had its first token):
	// the success goes where its prompt is new
	r.Begin(ids[1], req, nil, &f)
	r.End(&f, 3, -1, true)
	if !r.finishedTail(req.Hashes[len(req.Hashes)-1], ids[1]) {
		t.Fatal("a finished request did not mark its tail")
	}
}

// TestTailIsContinuedOnce: a finished tail stands for one conversation's
// next turn. The first request that begins as its continuation takes it,
// so a second prompt extending the same prefix (another user of a shared
// template whose question spills past its last block) is not credited as
// a continuation; and a request whose every block its replica held
// already (a short question inside the template's last partial block)
// leaves no tail, where every later user's prompt would end too.
func TestTailIsContinuedOnce(t *testing.T) {
	r, ids := newTestRouter(t, Config{}, 1)
	id := ids[0]
	tmpl := strings.Repeat("Company policy, section and clause. ", 114)[:4096]
	short := func(q string) *Request { return request(t, chatBody("m", tmpl, q), 1) }
	long := func(q string) *Request { return request(t, chatBody("m", tmpl, fmt.Sprintf("%-600s", q)), 1) }
	run := func(req *Request) {
		t.Helper()
		var f Flight
		r.Begin(id, req, nil, &f)
		r.FirstToken(&f, 1)
		r.End(&f, 2, -1, true)
	}
	first := short("hi")
	tail := first.Hashes[len(first.Hashes)-1]
	run(first) // the template's blocks are new on the replica: a tail
	if !r.finishedTail(tail, id) {
		t.Fatal("the first request extended the replica's chain and left no tail")
	}
	a, b := long("user a asks"), long("user b asks")
	if a.Hashes[len(first.Hashes)-1] != tail || len(a.Hashes) <= len(first.Hashes) {
		t.Fatal("the long questions must extend the template's chain")
	}
	var f Flight
	r.Begin(id, a, nil, &f)
	if !f.cont {
		t.Fatal("the first prompt extending the tail is its continuation")
	}
	if r.finishedTail(tail, id) {
		t.Fatal("a continuation did not take the tail it continues")
	}
	r.FirstToken(&f, 1)
	r.End(&f, 2, -1, true)
	run(short("hello")) // every block held: no tail
	if r.finishedTail(tail, id) {
		t.Fatal("a request that added no block to the replica left a tail")
	}
	var g Flight
	r.Begin(id, b, nil, &g)
	defer r.End(&g, 3, -1, true)
	if g.cont {
		t.Fatal("a second user extending the template read as a continuation")
	}
}

// TestContinuationPricesMeasuredLoad: a chat's next turn whose home runs
// more requests than an idle replica holding only the system prompt. The
// LoadPenaltySeconds floor (5 ms a busy request) prices six busy requests
// above the history's recompute and moves the turn; busy requests measured
// to cost nothing (β 0: an engine whose batch does not slow a new prefill)
// keep it home, as long as the home has batch slots for as many again.
// Near a known limit the floor stays: turns kept at full homes make the
// next ones wait for a slot.
func TestContinuationPricesMeasuredLoad(t *testing.T) {
	for _, tc := range []struct {
		name     string
		slots    int // the home's batch slots; 0 = unknown
		busy     int
		wantHome bool
	}{
		{"no limit known, 6 busy: the turn stays home", 0, 6, true},
		{"16 slots, 6 busy: room for as many again, stays", 16, 6, true},
		{"12 slots, 6 busy: near the limit, the floor moves it", 12, 6, false},
		{"no limit known, 2 busy: stays, as before", 0, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRouter(Config{})
			if err != nil {
				t.Fatal(err)
			}
			home, err := r.AddReplica(ReplicaSpec{Name: "home", Models: []string{"m"}, BatchSlots: tc.slots})
			if err != nil {
				t.Fatal(err)
			}
			other, err := r.AddReplica(ReplicaSpec{Name: "other", Models: []string{"m"}, BatchSlots: tc.slots})
			if err != nil {
				t.Fatal(err)
			}
			learnCredit(t, r, home, other, true)
			for i := range tc.busy {
				var f Flight
				r.Begin(home, &Request{Model: []byte("m"), PromptTokens: 64, Hashes: []uint64{0xb0 + uint64(i)}}, nil, &f)
				r.FirstToken(&f, 1)
			}
			if b := r.Replicas()[0].BusyCostSeconds; b != 0 {
				t.Fatalf("β %g: the case needs none measured", b)
			}
			d := decide(t, r, chatTurn(t, 9, 1))
			if got := d.Ranked[0] == home; got != tc.wantHome {
				t.Fatalf("ranked %v (cached %v), want home first: %v", d.Ranked, d.CachedTokens, tc.wantHome)
			}
		})
	}
}
