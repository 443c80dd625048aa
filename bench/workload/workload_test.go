package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"reflect"
	"strings"
	"testing"
)

func TestGeneratorsDeterministicAndShaped(t *testing.T) {
	sp := DefaultSharedPrefix()
	sp.Seed = 7
	mt := DefaultMultiTurn()
	mt.Seed = 7
	mt.Conversations = 20
	ns := DefaultNoSharing()
	ns.Seed = 7
	mx := DefaultMixed()
	mx.Seed = 7
	oc := DefaultOneCompany()
	oc.Seed = 7
	gw := DefaultGateway()
	gw.Seed = 7
	tests := []struct {
		name  string
		gen   func() (*Workload, error)
		count int
	}{
		{"shared-prefix", func() (*Workload, error) { return SharedPrefix(sp) }, 64 * 16},
		{"b2b-saas", func() (*Workload, error) { c := B2BSaaS(); c.Seed = 7; return SharedPrefix(c) }, 150 * 5},
		{"multi-turn", func() (*Workload, error) { return MultiTurn(mt) }, -1},
		{"no-sharing", func() (*Workload, error) { return NoSharing(ns) }, 1000},
		{"mixed", func() (*Workload, error) { return Mixed(mx) }, 1000},
		{"one-company", func() (*Workload, error) { return OneCompany(oc) }, 1024},
		{"gateway", func() (*Workload, error) { return Gateway(gw) }, 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := tt.gen()
			if err != nil {
				t.Fatal(err)
			}
			b, _ := tt.gen()
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed gave different workloads")
			}
			if tt.count >= 0 && len(a.Requests) != tt.count {
				t.Fatalf("got %d requests, want %d", len(a.Requests), tt.count)
			}
			for i := range a.Requests {
				r := &a.Requests[i]
				if r.ID != i || (i > 0 && r.Arrival < a.Requests[i-1].Arrival) {
					t.Fatalf("request %d: ids or arrivals out of order", i)
				}
				if r.OutputTokens <= 0 || r.PromptTokens() <= 0 || r.Model == "" {
					t.Fatalf("request %d: empty shape %+v", i, r)
				}
			}
		})
	}
}

func TestSharedPrefixShape(t *testing.T) {
	w, err := SharedPrefix(DefaultSharedPrefix())
	if err != nil {
		t.Fatal(err)
	}
	groups := map[int]Segment{}
	perGroup := map[int]int{}
	for _, r := range w.Requests {
		sys := r.Messages[0].Segments[0]
		if sys.Tokens != 2048 || r.Messages[1].Segments[0].Tokens != 128 || r.OutputTokens != 256 {
			t.Fatalf("wrong token shape %+v", r.Messages)
		}
		if g, ok := groups[r.Group]; ok && g != sys {
			t.Fatalf("group %d has two system prompts", r.Group)
		}
		groups[r.Group] = sys
		perGroup[r.Group]++
	}
	if len(groups) != 64 {
		t.Fatalf("got %d groups", len(groups))
	}
	for g, n := range perGroup {
		if n != 16 {
			t.Fatalf("group %d has %d prompts", g, n)
		}
	}
	// shuffled: the first 16 requests are not all one group
	first := w.Requests[0].Group
	same := 0
	for _, r := range w.Requests[:16] {
		if r.Group == first {
			same++
		}
	}
	if same == 16 {
		t.Fatal("requests are not shuffled")
	}
}

func TestMultiTurnGrowsHistory(t *testing.T) {
	c := DefaultMultiTurn()
	c.Conversations = 5
	w, err := MultiTurn(c)
	if err != nil {
		t.Fatal(err)
	}
	byConv := map[int][]Request{}
	for _, r := range w.Requests {
		byConv[r.Conversation] = append(byConv[r.Conversation], r)
	}
	for conv, rs := range byConv {
		if len(rs) < 12 || len(rs) > 18 {
			t.Fatalf("conversation %d has %d turns", conv, len(rs))
		}
		for k := 1; k < len(rs); k++ {
			prev, cur := rs[k-1], rs[k]
			if cur.Turn != k || cur.Arrival < prev.Arrival {
				t.Fatalf("conversation %d turn order broken", conv)
			}
			// prompt k = prompt k-1 + answer k-1 + question k
			if len(cur.Messages) != len(prev.Messages)+2 || !reflect.DeepEqual(cur.Messages[:len(prev.Messages)], prev.Messages) {
				t.Fatalf("conversation %d turn %d does not extend the previous prompt", conv, k)
			}
			if cur.Messages[len(prev.Messages)].Role != Assistant || cur.Messages[len(cur.Messages)-1].Role != User {
				t.Fatalf("conversation %d turn %d: wrong roles", conv, k)
			}
		}
		if rs[0].Messages[0].Role != System || rs[0].Messages[0].Segments[0].Tokens != 1024 {
			t.Fatal("shared system prompt missing")
		}
	}
}

func TestAppendSegment(t *testing.T) {
	a := AppendSegment(nil, Segment{ID: 42, Tokens: 101})
	b := AppendSegment(nil, Segment{ID: 42, Tokens: 101})
	c := AppendSegment(nil, Segment{ID: 43, Tokens: 101})
	if len(a) != 101*BytesPerToken || !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Fatalf("segment text: len %d, equal ids equal=%v, different ids equal=%v", len(a), bytes.Equal(a, b), bytes.Equal(a, c))
	}
	// a longer segment with the same id starts with the shorter one's text
	long := AppendSegment(nil, Segment{ID: 42, Tokens: 300})
	if !bytes.HasPrefix(long, a[:100*BytesPerToken]) {
		t.Fatal("segment text is not prefix-stable")
	}
	if allocs := testing.AllocsPerRun(100, func() { a = AppendSegment(a[:0], Segment{ID: 9, Tokens: 101}) }); allocs != 0 {
		t.Fatalf("AppendSegment allocates %v per run", allocs)
	}
}

func TestChatBodyIsValidJSON(t *testing.T) {
	w, _ := MultiTurn(MultiTurnConfig{Conversations: 1, MinTurns: 3, MaxTurns: 3, SharedTokens: 10, QuestionTokens: 5, AnswerTokens: 7, ThinkSeconds: 1, ConversationRPS: 1})
	body := AppendChatBody(nil, &w.Requests[2], true)
	var v struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		MaxTokens int  `json:"max_tokens"`
		Stream    bool `json:"stream"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	roles := []string{}
	for _, m := range v.Messages {
		roles = append(roles, m.Role)
	}
	if got := strings.Join(roles, ","); got != "system,user,assistant,user,assistant,user" || v.MaxTokens != 7 || !v.Stream || v.Model != DefaultModel {
		t.Fatalf("unexpected body %s", body)
	}
	if len(v.Messages[0].Content) != 10*BytesPerToken {
		t.Fatalf("system content %d bytes", len(v.Messages[0].Content))
	}
}

func TestMooncake(t *testing.T) {
	w, err := LoadMooncake("../../../shared/workloads/mooncake-synthetic.jsonl", "", 1)
	if errors.Is(err, fs.ErrNotExist) {
		// the trace lives beside the checkout; fall back to an inline sample
		w = nil
	} else if err != nil {
		t.Fatal(err)
	}
	if w != nil {
		if len(w.Requests) != 3993 {
			t.Fatalf("got %d requests", len(w.Requests))
		}
		reuse, total := Reuse(w)
		share := float64(reuse) / float64(total)
		// The trace's README states about 65% best-case reuse.
		if share < 0.60 || share > 0.70 {
			t.Fatalf("reusable share %.3f, want about 0.65", share)
		}
		t.Logf("mooncake: %d requests, reusable prompt share %.3f", len(w.Requests), share)
	}
	in := `{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [1, 2]}
{"timestamp": 10, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]}
`
	w, err = ReadMooncake(strings.NewReader(in), "m", 0.5)
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 := w.Requests[0], w.Requests[1]
	if r0.PromptTokens() != 600 || r1.PromptTokens() != 1100 || r1.Arrival != 5e6 {
		t.Fatalf("tokens %d %d arrival %d", r0.PromptTokens(), r1.PromptTokens(), r1.Arrival)
	}
	if r0.Messages[0].Segments[0] != r1.Messages[0].Segments[0] || r0.Messages[0].Segments[1].Tokens != 88 || r1.Messages[0].Segments[1].Tokens != 512 {
		t.Fatalf("segments %+v %+v", r0.Messages[0].Segments, r1.Messages[0].Segments)
	}
	reuse, total := Reuse(w)
	if reuse != 512 || total != 1700 {
		t.Fatalf("reuse %d/%d, want 512/1700 (block 2 differs in length)", reuse, total)
	}

	bad := []struct{ name, in, want string }{
		{"not json", "{", "line 1"},
		{"no timestamp", `{"input_length": 1, "output_length": 1, "hash_ids": [1]}`, "missing field timestamp"},
		{"bad input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, "input_length must be > 0"},
		{"ids mismatch", `{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}`, "hash_ids has 1 ids"},
		{"empty", "", "no requests"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadMooncake(strings.NewReader(tt.in), "", 1)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
}

// TestOneCompanyShape: one shared instruction prefix, distinct questions
// in range, users in range, arrivals in bursts, a different seed a
// different workload.
func TestOneCompanyShape(t *testing.T) {
	c := DefaultOneCompany()
	c.Seed, c.Requests, c.BurstSize, c.BurstWindow, c.RPS = 3, 400, 20, 0.25, 10
	w, err := OneCompany(c)
	if err != nil {
		t.Fatal(err)
	}
	instr := w.Requests[0].Messages[0].Segments[0]
	questions := map[uint64]bool{}
	users := map[int]bool{}
	for i := range w.Requests {
		r := &w.Requests[i]
		if len(r.Messages) != 2 || r.Messages[0].Role != System || r.Messages[1].Role != User {
			t.Fatalf("request %d: messages %+v", i, r.Messages)
		}
		if s := r.Messages[0].Segments; len(s) != 1 || s[0] != instr || s[0].Tokens != c.InstructionTokens {
			t.Fatalf("request %d: instruction %+v, want %+v", i, s, instr)
		}
		q := r.Messages[1].Segments[0]
		if q.Tokens < c.MinQuestion || q.Tokens > c.MaxQuestion || questions[q.ID] {
			t.Fatalf("request %d: question %+v (repeat %v)", i, q, questions[q.ID])
		}
		questions[q.ID] = true
		if r.Client < 0 || r.Client >= c.Users || r.Group != 0 || r.Conversation != -1 || r.OutputTokens != c.OutputTokens {
			t.Fatalf("request %d: %+v", i, r)
		}
		users[r.Client] = true
	}
	if len(users) < c.Users/2 {
		t.Fatalf("%d distinct users of %d", len(users), c.Users)
	}
	// Bursty: 20 bursts of 20 arrivals within 0.25 s, bursts 2 s apart on
	// average: at least 90% of the gaps fall inside a burst window, and
	// some gaps between bursts exceed 1 s.
	var short, long int
	for i := 1; i < len(w.Requests); i++ {
		gap := float64(w.Requests[i].Arrival-w.Requests[i-1].Arrival) / 1e9
		if gap <= c.BurstWindow {
			short++
		}
		if gap > 1 {
			long++
		}
	}
	if short < len(w.Requests)*9/10 || long == 0 {
		t.Fatalf("gaps: %d within a burst window, %d over 1 s, of %d", short, long, len(w.Requests)-1)
	}
	c.Seed = 4
	w2, _ := OneCompany(c)
	if w2.Requests[0].Messages[0].Segments[0] == instr {
		t.Fatal("another seed, the same instruction prompt")
	}
}

// TestGatewayShape: most requests come from one address (client 0) yet
// carry many tenants' prefixes; direct clients are each one user of one
// tenant; a different seed gives a different workload.
func TestGatewayShape(t *testing.T) {
	c := DefaultGateway()
	c.Seed = 3
	w, err := Gateway(c)
	if err != nil {
		t.Fatal(err)
	}
	viaGateway, tenantsBehind := 0, map[int]bool{}
	direct := map[int]int{} // client -> tenant
	for _, r := range w.Requests {
		if r.Group < 0 || r.Group >= c.Tenants || r.PromptTokens() != c.SystemTokens+c.QuestionTokens {
			t.Fatalf("request %d: tenant %d, %d prompt tokens", r.ID, r.Group, r.PromptTokens())
		}
		if r.Client == 0 {
			viaGateway++
			tenantsBehind[r.Group] = true
			continue
		}
		if g, ok := direct[r.Client]; ok && g != r.Group {
			t.Fatalf("direct client %d in tenants %d and %d", r.Client, g, r.Group)
		}
		direct[r.Client] = r.Group
	}
	if share := float64(viaGateway) / float64(len(w.Requests)); share < 0.65 || share > 0.85 {
		t.Errorf("%.2f of requests via the gateway, want about %.2f", share, c.GatewayShare)
	}
	if len(tenantsBehind) != c.Tenants {
		t.Errorf("the gateway carries %d of %d tenants' prefixes", len(tenantsBehind), c.Tenants)
	}
	c.Seed = 4
	other, _ := Gateway(c)
	if reflect.DeepEqual(w.Requests, other.Requests) {
		t.Error("a different seed gave the same workload")
	}
	if _, err := Gateway(GatewayConfig{Requests: 1, Tenants: 1, Users: 1, QuestionTokens: 1, OutputTokens: 1, RPS: 1, GatewayShare: 2}); err == nil || !strings.Contains(err.Error(), "gateway_share") {
		t.Errorf("got %v", err)
	}
}

// TestMooncakeHasNoSessions: the trace names no session, so every request
// is its own client, even when all share a first block.
func TestMooncakeHasNoSessions(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [1, 2]}
{"timestamp": 10, "input_length": 600, "output_length": 4, "hash_ids": [1, 3]}
{"timestamp": 20, "input_length": 600, "output_length": 4, "hash_ids": [65, 4]}
`
	w, err := ReadMooncake(strings.NewReader(in), "m", 1)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, r := range w.Requests {
		if seen[r.Client] {
			t.Fatalf("client %d twice: %+v", r.Client, w.Requests)
		}
		seen[r.Client] = true
	}
}

func TestBadConfigsNamed(t *testing.T) {
	if _, err := OneCompany(OneCompanyConfig{Requests: 1, Users: 1, InstructionTokens: 1, MinQuestion: 5, MaxQuestion: 2, OutputTokens: 1, BurstSize: 1, RPS: 1}); err == nil || !strings.Contains(err.Error(), "max_question") {
		t.Fatalf("got %v", err)
	}
	if _, err := SharedPrefix(SharedPrefixConfig{}); err == nil || !strings.Contains(err.Error(), "groups") {
		t.Fatalf("got %v", err)
	}
	if _, err := MultiTurn(MultiTurnConfig{Conversations: 1, MinTurns: 5, MaxTurns: 2}); err == nil || !strings.Contains(err.Error(), "max_turns") {
		t.Fatalf("got %v", err)
	}
	if _, err := Mixed(MixedConfig{Requests: 1, RPS: 1, BurstFactor: 1, LongTokens: 1, ShortTokens: 1, OutputTokens: 1}); err == nil || !strings.Contains(err.Error(), "models[0]") {
		t.Fatalf("got %v", err)
	}
}

func BenchmarkAppendChatBody(b *testing.B) {
	w, _ := SharedPrefix(DefaultSharedPrefix())
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendChatBody(buf[:0], &w.Requests[0], true)
	}
	b.SetBytes(int64(len(buf)))
}

// TestSharedSeedKeepsSharedPrompts: a workload drawn with another seed and
// the first draw's seed as its shared seed carries the first draw's shared
// prompts (system prompts, instructions, documents) and its own questions;
// without the shared seed its shared prompts are its own too.
func TestSharedSeedKeepsSharedPrompts(t *testing.T) {
	draw := func(seed, shared uint64) map[string]*Workload {
		sp := DefaultSharedPrefix()
		sp.Seed, sp.SharedSeed = seed, shared
		mt := DefaultMultiTurn()
		mt.Seed, mt.SharedSeed, mt.Conversations = seed, shared, 8
		mx := DefaultMixed()
		mx.Seed, mx.SharedSeed = seed, shared
		oc := DefaultOneCompany()
		oc.Seed, oc.SharedSeed = seed, shared
		gw := DefaultGateway()
		gw.Seed, gw.SharedSeed = seed, shared
		out := map[string]*Workload{}
		for name, f := range map[string]func() (*Workload, error){
			"shared-prefix": func() (*Workload, error) { return SharedPrefix(sp) },
			"multi-turn":    func() (*Workload, error) { return MultiTurn(mt) },
			"mixed":         func() (*Workload, error) { return Mixed(mx) },
			"one-company":   func() (*Workload, error) { return OneCompany(oc) },
			"gateway":       func() (*Workload, error) { return Gateway(gw) },
		} {
			w, err := f()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			out[name] = w
		}
		return out
	}
	// ids collects the segment ids of one role across a workload.
	ids := func(w *Workload, role Role) map[uint64]bool {
		m := map[uint64]bool{}
		for _, r := range w.Requests {
			for _, msg := range r.Messages {
				if msg.Role == role {
					for _, s := range msg.Segments {
						m[s.ID] = true
					}
				}
			}
		}
		return m
	}
	overlap := func(a, b map[uint64]bool) int {
		n := 0
		for id := range a {
			if b[id] {
				n++
			}
		}
		return n
	}
	first, kept, own := draw(1, 0), draw(2, 1), draw(2, 0)
	for name, w := range first {
		sys, user := ids(w, System), ids(w, User)
		if len(sys) == 0 {
			t.Fatalf("%s: no shared prompt", name)
		}
		if n := overlap(ids(kept[name], System), sys); n == 0 {
			t.Errorf("%s: drawn with shared seed 1, none of its shared prompts is the seed-1 draw's", name)
		}
		if n := overlap(ids(kept[name], User), user); n != 0 {
			t.Errorf("%s: drawn with seed 2, %d of its questions are the seed-1 draw's", name, n)
		}
		if n := overlap(ids(own[name], System), sys); n != 0 {
			t.Errorf("%s: drawn with seed 2 alone, %d of its shared prompts are the seed-1 draw's", name, n)
		}
	}
}
