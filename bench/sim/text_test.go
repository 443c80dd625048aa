package sim

import (
	"bytes"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/workload"
)

// withTextStore runs the test with sharedText and sharedHashes replaced by
// empty stores of the given limit.
func withTextStore(t *testing.T, limit int) *textStore {
	t.Helper()
	oldText, oldHashes := sharedText, sharedHashes
	sharedText, sharedHashes = newTextStore(limit), newHashStore(limit)
	t.Cleanup(func() { sharedText, sharedHashes = oldText, oldHashes })
	return sharedText
}

// TestTextCacheIsTheGenerator: the text a run gets from the cross-run store
// is workload.AppendSegment's, byte for byte, on a cold store, a warm one
// and one that fills up and is dropped mid-run.
func TestTextCacheIsTheGenerator(t *testing.T) {
	mt := workload.DefaultMultiTurn()
	mt.Conversations, mt.Seed = 6, 3
	multi, err := workload.MultiTurn(mt)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		limit int
	}{{"roomy", 64 << 20}, {"drops", 6000}} {
		t.Run(tc.name, func(t *testing.T) {
			st := withTextStore(t, tc.limit)
			var total int
			for pass := range 2 { // cold, then warm
				c := newTextCache()
				for _, w := range []*workload.Workload{smallShared(t, 30), multi} {
					for i := range w.Requests {
						for mi := range w.Requests[i].Messages {
							m := &w.Requests[i].Messages[mi]
							got := c.appendMessage([]byte("x"), m)
							want := workload.AppendMessageText([]byte("x"), m)
							if !bytes.Equal(got, want) {
								t.Fatalf("pass %d, %s request %d message %d: cached text differs from the generator", pass, w.Name, i, mi)
							}
							if pass == 0 {
								total += len(want) - 1
							}
						}
					}
				}
			}
			if tc.limit < total && st.bytes > tc.limit {
				t.Fatalf("store holds %d bytes, limit %d", st.bytes, tc.limit)
			}
			if len(st.m) == 0 {
				t.Fatal("store kept nothing")
			}
		})
	}
}

// TestWarmTextSameResults: a run on cold text and hash stores, a run on the
// stores it left warm, and a run on stores too small to keep anything give
// the same Result, outcome by outcome.
func TestWarmTextSameResults(t *testing.T) {
	mt := workload.DefaultMultiTurn()
	mt.Conversations, mt.Seed = 8, 5
	multi, err := workload.MultiTurn(mt)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workload.Workload{smallShared(t, 60), multi} {
		cfg := Config{Replicas: 4, Policy: "cost", Seed: 2, KeepOutcomes: true}
		var res []*Result
		for _, limit := range []int{64 << 20, -1, 1} { // -1: keep the warm store
			if limit > 0 {
				withTextStore(t, limit)
			}
			r, err := Run(cfg, w)
			if err != nil {
				t.Fatal(err)
			}
			r.DecideNanos = 0
			res = append(res, r)
		}
		if !reflect.DeepEqual(res[0], res[1]) || !reflect.DeepEqual(res[0], res[2]) {
			t.Fatalf("%s: cold, warm and uncached text give different results", w.Name)
		}
	}
}

// TestStoredHashesAreTheEngines: after a run, the block hashes, length and
// tail the store holds for each request are those of its engine prompt
// rendered afresh
// (generator text, the engine's template), for single prompts and the
// first turns of conversations; later turns, which carry the engine's
// answers, are not stored.
func TestStoredHashesAreTheEngines(t *testing.T) {
	withTextStore(t, 64<<20)
	mt := workload.DefaultMultiTurn()
	mt.Conversations, mt.Seed = 6, 4
	multi, err := workload.MultiTurn(mt)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workload.Workload{smallShared(t, 40), multi} {
		if _, err := Run(Config{Replicas: 3, Policy: "cost", Seed: 1}, w); err != nil {
			t.Fatal(err)
		}
		bs := enginesim.DefaultConfig().BlockSize
		stored := 0
		for i := range w.Requests {
			r := &w.Requests[i]
			e := sharedHashes.get(appendPromptDesc(nil, r, bs))
			answered := false
			var msgs []enginesim.Message
			for mi := range r.Messages {
				answered = answered || r.Messages[mi].Role == workload.Assistant
				msgs = append(msgs, enginesim.Message{Role: r.Messages[mi].Role.String(),
					Content: string(workload.AppendMessageText(nil, &r.Messages[mi]))})
			}
			if answered {
				if e != nil {
					t.Fatalf("%s request %d: hashes stored for a prompt with the engine's answers", w.Name, i)
				}
				continue
			}
			if e == nil {
				t.Fatalf("%s request %d: nothing stored", w.Name, i)
			}
			ep := enginesim.AppendChatPrompt(nil, msgs, nil)
			want := enginesim.BlockHashes(nil, ep, bs, "", "")
			if !slices.Equal(e.hashes, want) {
				t.Fatalf("%s request %d: stored %d hashes, the prompt has %d (or they differ)", w.Name, i, len(e.hashes), len(want))
			}
			if tail := ep[min(len(want)*bs*enginesim.BytesPerToken, len(ep)):]; e.promptBytes != len(ep) || !bytes.Equal(e.tail, tail) {
				t.Fatalf("%s request %d: stored a %d-byte prompt ending %q, it is %d bytes ending %q", w.Name, i, e.promptBytes, e.tail, len(ep), tail)
			}
			var text []byte
			for _, seg := range e.text {
				text = append(text, seg...)
			}
			var all []byte
			for mi := range r.Messages {
				all = workload.AppendMessageText(all, &r.Messages[mi])
			}
			if e.text == nil || !bytes.Equal(text, all) {
				t.Fatalf("%s request %d: stored text differs from the generator's", w.Name, i)
			}
			stored++
		}
		if stored == 0 {
			t.Fatalf("%s: nothing stored", w.Name)
		}
	}
	d := appendPromptDesc(nil, &multi.Requests[0], 16)
	d[len(d)-1]++
	if sharedHashes.get(d) != nil {
		t.Fatal("a different description found stored hashes")
	}
}

// TestParsedPromptIsParse: what a run keeps of the router's parse of a
// stored prompt's body is what ParseChat makes of the body the generator
// writes, for the router's hash configuration and the request's model; a
// router with another block size parses for itself (and then keeps its
// own); a second run decides with the kept parse and gets the first run's
// outcomes.
func TestParsedPromptIsParse(t *testing.T) {
	withTextStore(t, 64<<20)
	w := smallShared(t, 40)
	cfg := Config{Replicas: 3, Policy: "cost", Seed: 1, KeepOutcomes: true}
	first, err := Run(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	hc := affinity.HashConfig{}.WithDefaults()
	bs := enginesim.DefaultConfig().BlockSize
	p := affinity.NewParser(hc)
	var pr affinity.Prompt
	for i := range w.Requests {
		r := &w.Requests[i]
		e := sharedHashes.get(appendPromptDesc(nil, r, bs))
		if e == nil {
			t.Fatalf("request %d: nothing stored", i)
		}
		pp := e.parsedFor(hc, r.Model)
		if pp == nil {
			t.Fatalf("request %d: no parse kept", i)
		}
		if err := p.ParseChat(workload.AppendChatBody(nil, r, true), &pr); err != nil {
			t.Fatal(err)
		}
		if string(pp.model) != string(pr.Model) || pp.tokens != pr.Tokens || !slices.Equal(pp.hashes, pr.Hashes) {
			t.Fatalf("request %d: kept %q, %d tokens, %d hashes; the parse gives %q, %d, %d (or other hashes)",
				i, pp.model, pp.tokens, len(pp.hashes), pr.Model, pr.Tokens, len(pr.Hashes))
		}
		if pp.nanos <= 0 {
			t.Fatalf("request %d: the parse's time was not kept", i)
		}
		if e.parsedFor(affinity.HashConfig{BlockTokens: 32}.WithDefaults(), r.Model) != nil || e.parsedFor(hc, r.Model+"x") != nil {
			t.Fatalf("request %d: a parse kept for another configuration or model was offered", i)
		}
	}
	second, err := Run(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first.Outcomes, second.Outcomes) {
		t.Fatal("a run deciding with the kept parses differs from the run that parsed")
	}
	var parsed int64
	for i := range w.Requests {
		parsed += sharedHashes.get(appendPromptDesc(nil, &w.Requests[i], bs)).parsedFor(hc, w.Requests[i].Model).nanos
	}
	if second.DecideNanos < parsed {
		t.Fatalf("router CPU %d ns with the kept parses, less than their parse times (%d ns)", second.DecideNanos, parsed)
	}
	// a router hashing 32-token blocks parses again: its decisions differ
	// from a cold store's run only if the kept parse leaked in
	c32 := cfg
	c32.Router.Hash.BlockTokens = 32
	warm, err := Run(c32, w)
	if err != nil {
		t.Fatal(err)
	}
	if sharedHashes.get(appendPromptDesc(nil, &w.Requests[0], bs)).parsedFor(c32.Router.Hash.WithDefaults(), w.Requests[0].Model) == nil {
		t.Fatal("the 32-token router's parse was not kept")
	}
	withTextStore(t, 64<<20)
	cold, err := Run(c32, w)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(warm.Outcomes, cold.Outcomes) {
		t.Fatal("a router with 32-token blocks decided with the 64-token parse")
	}
}

// TestConcurrentRunsShareStores: runs at once on cold stores (a suite runs
// several) fill and read them together and get the result of a run alone;
// -race checks the stores' locking.
func TestConcurrentRunsShareStores(t *testing.T) {
	w := smallShared(t, 60)
	cfg := Config{Replicas: 4, Policy: "cost", Seed: 3, KeepOutcomes: true}
	withTextStore(t, 64<<20)
	want, err := Run(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	want.DecideNanos = 0
	withTextStore(t, 64<<20)
	res := make([]*Result, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = Run(cfg, w)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		r.DecideNanos = 0
		if !reflect.DeepEqual(r, want) {
			t.Fatalf("run %d of 3 at once differs from a run alone", i)
		}
	}
}
