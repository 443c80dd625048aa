package llamacpp

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/warmpath/warmpath/bench/workload"
	"github.com/warmpath/warmpath/slowpath"
	"github.com/warmpath/warmpath/slowpath/slowpathtest"
)

// timings is llama-server's extension of a chat answer (and of the final
// streamed chunk).
type timings struct {
	Timings *struct {
		CacheN  int     `json:"cache_n"`
		PromptN int     `json:"prompt_n"`
		PromptM float64 `json:"prompt_ms"`
	} `json:"timings"`
}

func timingsOf(t *testing.T, raw string) timings {
	t.Helper()
	var tm timings
	if err := json.Unmarshal([]byte(raw), &tm); err != nil {
		t.Fatalf("answer: %v: %s", err, raw)
	}
	return tm
}

// TestWarmpathInFront puts warmpath's slowpath (in process, cost policy)
// in front of two real llama-servers (2 slots each) and holds a
// shared-prefix chat through it with the official OpenAI client, streamed
// and not: every answer arrives, SSE relays, warmpath scrapes the engines,
// and a repeat of the long shared prefix is served from llama.cpp's prompt
// cache (cached_tokens > 0, equal to timings.cache_n), which warmpath reads
// back from both kinds of answer.
func TestWarmpathInFront(t *testing.T) {
	const model = "tiny"
	f := startFleet(t, Options{N: 2, Slots: 2, CtxPerSlot: 4096, Alias: model})
	start := time.Now()

	cfg := slowpath.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Health.Interval, cfg.Health.Timeout = 500*time.Millisecond, 500*time.Millisecond
	cfg.Scrape.Interval, cfg.Scrape.Timeout, cfg.Scrape.StaleAfter = 100*time.Millisecond, 100*time.Millisecond, 5*time.Second
	for _, a := range f.Addrs() {
		cfg.Replicas = append(cfg.Replicas, slowpath.ReplicaConfig{Address: a, Models: []string{model}})
	}
	s, err := slowpath.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []slowpath.RoutedEvent
	s.Observer = slowpath.ObserverFunc(func(ev *slowpath.RoutedEvent) {
		mu.Lock()
		events = append(events, *ev)
		mu.Unlock()
	})
	url := slowpathtest.Serve(t, s)
	admin := httptest.NewServer(s.AdminHandler())
	t.Cleanup(admin.Close)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
		option.WithRequestTimeout(time.Minute))

	// Before any traffic: /props and /slots read, every slot fresh (the
	// slot model knows them empty, affinity.EngineSignals.FreshSlots).
	// Bounded wait: 100 scrapes.
	var fresh []int
	for range 100 {
		fresh = freshSlots(t, admin.URL)
		if len(fresh) == 2 && fresh[0] > 0 && fresh[1] > 0 {
			break
		}
		time.Sleep(cfg.Scrape.Interval)
	}
	if !slices.Equal(fresh, []int{2, 2}) {
		t.Fatalf("fresh slots %v before any request, want 2 of 2 on each engine", fresh)
	}

	// Three users share a 2,048-token system prompt; each asks twice, the
	// second turn carrying the first turn and its real answer. Odd requests
	// stream. Then the first request again, verbatim.
	sys := string(workload.AppendSegment(nil, workload.Segment{ID: 7, Tokens: 2048}))
	question := func(u, turn int) string {
		return string(workload.AppendSegment(nil, workload.Segment{ID: uint64(1000 + 10*u + turn), Tokens: 48}))
	}
	type sent struct {
		stream         bool
		cached, cacheN int
	}
	var log []sent
	ask := func(msgs []openai.ChatCompletionMessageParamUnion, stream bool) string {
		t.Helper()
		p := openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(8), Messages: msgs}
		if !stream {
			resp, err := c.Chat.Completions.New(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.PromptTokens < 2048 {
				t.Fatalf("answer %s", resp.RawJSON())
			}
			tm := timingsOf(t, resp.RawJSON())
			if tm.Timings == nil || tm.Timings.CacheN+tm.Timings.PromptN != int(resp.Usage.PromptTokens) {
				t.Fatalf("timings do not add up to prompt_tokens %d: %s", resp.Usage.PromptTokens, resp.RawJSON())
			}
			log = append(log, sent{false, int(resp.Usage.PromptTokensDetails.CachedTokens), tm.Timings.CacheN})
			return resp.Choices[0].Message.Content
		}
		p.StreamOptions.IncludeUsage = openai.Bool(true)
		st := c.Chat.Completions.NewStreaming(t.Context(), p)
		var chunks int
		var text strings.Builder
		var usage openai.CompletionUsage
		var tm timings
		for st.Next() {
			ch := st.Current()
			chunks++
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
			}
			if ch.Usage.PromptTokens > 0 {
				usage, tm = ch.Usage, timingsOf(t, ch.RawJSON())
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 3 || text.Len() == 0 || usage.PromptTokens < 2048 || tm.Timings == nil {
			t.Fatalf("stream: %d chunks, text %q, usage %+v, timings %v", chunks, text.String(), usage, tm.Timings)
		}
		log = append(log, sent{true, int(usage.PromptTokensDetails.CachedTokens), tm.Timings.CacheN})
		return text.String()
	}
	first := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage(question(0, 0))}
	n := 0
	for u := range 3 {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage(question(u, 0))}
		answer := ask(msgs, n%2 == 1)
		n++
		msgs = append(msgs, openai.AssistantMessage(answer), openai.UserMessage(question(u, 1)))
		ask(msgs, n%2 == 1)
		n++
	}
	// Before each repeat, every slot of both servers is idle: a slot
	// stays taken for a moment after its answer reached the client, and a
	// request arriving then is given another slot (on a loaded machine, an
	// empty one: no hit).
	idle := func() {
		t.Helper()
		for _, a := range f.Addrs() {
			for i := 0; ; i++ {
				var slots []struct {
					IsProcessing bool `json:"is_processing"`
				}
				getJSON(t, "http://"+a+"/slots", &slots)
				busy := false
				for _, sl := range slots {
					busy = busy || sl.IsProcessing
				}
				if !busy {
					break
				}
				if i == 500 {
					t.Fatalf("%s: a slot still processing after 5 s", a)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	idle()
	ask(first, false)
	idle()
	ask(first, true)

	for i, r := range log {
		if r.cached != r.cacheN {
			t.Errorf("request %d (stream %v): cached_tokens %d != timings.cache_n %d", i, r.stream, r.cached, r.cacheN)
		}
	}
	// The observer runs after warmpath finished its side of a response; a
	// streamed answer can reach the client first, so wait for the last
	// event (bounded: 500 polls).
	for range 500 {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n >= len(log) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if len(events) != len(log) {
		t.Errorf("observer saw %d requests, sent %d", len(events), len(log))
	}
	for i, ev := range events {
		if !ev.OK || ev.Status != http.StatusOK || i < len(log) && ev.CachedTokens != log[i].cached {
			t.Errorf("event %d: ok %v status %d, warmpath read cached %d, the client %d", i, ev.OK, ev.Status, ev.CachedTokens, log[i].cached)
		}
	}
	for _, i := range []int{len(log) - 2, len(log) - 1} { // the repeats
		if log[i].cached < 2048 {
			where := ""
			if i < len(events) {
				where = fmt.Sprintf(" (on %s, predicted %d)", events[i].Replica, events[i].PredictedCachedTokens)
			}
			t.Errorf("repeat %d (stream %v): cached_tokens %d%s, want the 2,048-token system prompt and more", i, log[i].stream, log[i].cached, where)
		}
	}
	if t.Failed() {
		for i, ev := range events {
			t.Logf("request %d: %s, predicted %d cached, engine %d", i, ev.Replica, ev.PredictedCachedTokens, ev.CachedTokens)
		}
	}
	mu.Unlock()

	// Fresh engine signals for both llama replicas: a scrape after the
	// traffic, no scrape error, not stale (bounded wait: 100 scrapes).
	type replicas struct {
		Replicas []struct {
			Name    string `json:"name"`
			Healthy bool   `json:"healthy"`
			Engine  struct {
				ScrapedAt time.Time `json:"scraped_at"`
				Stale     bool      `json:"stale"`
				Error     string    `json:"error"`
			} `json:"engine"`
			Affinity struct {
				CacheModel  string  `json:"cache_model"`
				BatchSlots  int     `json:"batch_slots"`
				StepSeconds float64 `json:"step_seconds"`
			} `json:"affinity"`
		} `json:"replicas"`
	}
	done := time.Now()
	var rs replicas
	for range 100 {
		resp, err := http.Get(admin.URL + "/debug/replicas")
		if err != nil {
			t.Fatal(err)
		}
		rs = replicas{}
		err = json.NewDecoder(resp.Body).Decode(&rs)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		fresh := len(rs.Replicas) == 2
		for _, r := range rs.Replicas {
			fresh = fresh && r.Healthy && r.Engine.ScrapedAt.After(done) && !r.Engine.Stale && r.Engine.Error == ""
		}
		if fresh {
			break
		}
		time.Sleep(cfg.Scrape.Interval)
	}
	for _, r := range rs.Replicas {
		if !r.Healthy || !r.Engine.ScrapedAt.After(start) || r.Engine.Stale || r.Engine.Error != "" {
			t.Errorf("replica %s: healthy %v, engine %+v", r.Name, r.Healthy, r.Engine)
		}
		// Discovered from llama.cpp's /metrics and /props: hits come from
		// the slot model (affinity/slotcache.go).
		if r.Affinity.CacheModel != "slots" || r.Affinity.BatchSlots < 1 {
			t.Errorf("replica %s: cache model %q with %d batch slots, want slots discovered", r.Name, r.Affinity.CacheModel, r.Affinity.BatchSlots)
		}
	}
	// The streamed answers' tokens taught a step clock (stepphase.go)
	// where they ran: llama.cpp sends each decode step's token as an event.
	stepped := false
	for _, r := range rs.Replicas {
		stepped = stepped || r.Affinity.StepSeconds > 0
	}
	if !stepped {
		t.Errorf("no replica learned a step from the streamed answers: %+v", rs.Replicas)
	}
	if err := f.Failure(); err != nil {
		t.Fatal(err)
	}
	t.Logf("requests (stream, cached_tokens): %+v", log)
}

// TestWarmpathAfterTraffic: warmpath started in front of a llama.cpp
// server that already served a request reads, from its /slots, one slot
// of two holding a prompt it never saw and one fresh (the slot model then
// advises no slot hold while the used slot is idle and unseen).
func TestWarmpathAfterTraffic(t *testing.T) {
	const model = "tiny"
	f := startFleet(t, Options{N: 1, Slots: 2, CtxPerSlot: 4096, Alias: model})
	base := "http://" + f.Addrs()[0]
	user := string(workload.AppendSegment(nil, workload.Segment{ID: 11, Tokens: 64}))
	if code, body := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":4}`, model, user)); code != http.StatusOK {
		t.Fatalf("direct request: %d %s", code, body)
	}
	cfg := slowpath.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Scrape.Interval, cfg.Scrape.Timeout = 100*time.Millisecond, 100*time.Millisecond
	cfg.Replicas = []slowpath.ReplicaConfig{{Address: f.Addrs()[0], Models: []string{model}}}
	s, err := slowpath.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	slowpathtest.Serve(t, s)
	admin := httptest.NewServer(s.AdminHandler())
	t.Cleanup(admin.Close)
	var fresh []int
	for range 100 { // bounded: 100 scrapes
		if fresh = freshSlots(t, admin.URL); len(fresh) == 1 && fresh[0] > 0 {
			break
		}
		time.Sleep(cfg.Scrape.Interval)
	}
	if !slices.Equal(fresh, []int{1}) {
		t.Fatalf("fresh slots %v after one direct request, want 1 of 2", fresh)
	}
}

// freshSlots is each replica's fresh_slots in warmpath's /debug/replicas.
func freshSlots(t *testing.T, admin string) []int {
	t.Helper()
	resp, err := http.Get(admin + "/debug/replicas")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rs struct {
		Replicas []struct {
			Engine struct {
				FreshSlots int `json:"fresh_slots"`
			} `json:"engine"`
		} `json:"replicas"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, r := range rs.Replicas {
		out = append(out, r.Engine.FreshSlots)
	}
	return out
}
