package slowpath_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
	"github.com/warmpath/warmpath/slowpath/slowpathtest"
)

const e2eModel = "sim-llama"

// startEngines starts n simulated engines 100x faster than life.
func startEngines(t testing.TB, n int, mutate func(*enginesim.Config)) []*enginesim.Server {
	t.Helper()
	var out []*enginesim.Server
	for i := range n {
		c := enginesim.DefaultConfig()
		c.ServedModelNames = []string{e2eModel}
		c.TimeScale = 0.01
		c.Seed = uint64(i + 1)
		c.Logger = slog.New(slog.DiscardHandler)
		c.OutputLen = enginesim.OutputLen{Median: 8, Sigma: 0.3, Min: 4, Max: 16}
		if mutate != nil {
			mutate(&c)
		}
		en, err := enginesim.Start(c, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { en.Close() })
		out = append(out, en)
	}
	return out
}

func e2eConfig(engines []*enginesim.Server) slowpath.Config {
	cfg := slowpath.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Health.Interval, cfg.Health.Timeout = 20*time.Millisecond, 20*time.Millisecond
	cfg.Scrape.Interval, cfg.Scrape.Timeout, cfg.Scrape.StaleAfter = 20*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond
	cfg.Passive.EjectTime, cfg.Passive.MaxEjectTime = time.Minute, time.Minute
	cfg.ReloadInterval = 20 * time.Millisecond
	for _, en := range engines {
		cfg.Replicas = append(cfg.Replicas, slowpath.ReplicaConfig{Address: en.Addr(), Models: []string{e2eModel}})
	}
	return cfg
}

// routed records which replica served each request (the Observer seam).
type routed struct {
	mu   sync.Mutex
	reps []string
	pred []int
	got  []int
	// prompt: the engine's reported prompt tokens (-1 when not reported)
	prompt []int
	pttft  []float64 // the router's predicted TTFT, seconds
}

func (r *routed) ObserveRouted(ev *slowpath.RoutedEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reps = append(r.reps, ev.Replica)
	r.pred = append(r.pred, ev.PredictedCachedTokens)
	r.got = append(r.got, ev.CachedTokens)
	r.prompt = append(r.prompt, ev.ReportedPromptTokens)
	r.pttft = append(r.pttft, ev.PredictedTTFT)
}

func (r *routed) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]int{}
	for _, x := range r.reps {
		m[x]++
	}
	return m
}

func serve(t testing.TB, s *slowpath.Server) string {
	t.Helper()
	return slowpathtest.Serve(t, s)
}

func startE2E(t testing.TB, engines []*enginesim.Server, mutate func(*slowpath.Config)) (*slowpath.Server, openai.Client, *routed) {
	t.Helper()
	cfg := e2eConfig(engines)
	if mutate != nil {
		mutate(&cfg)
	}
	s, url, obs := startObserved(t, cfg)
	return s, testOpenAI(url), obs
}

// startObserved serves a Server built from cfg with a routed observer
// until the test ends; it returns the API base URL.
func startObserved(t testing.TB, cfg slowpath.Config) (*slowpath.Server, string, *routed) {
	t.Helper()
	s, err := slowpath.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	obs := &routed{}
	s.Observer = obs
	return s, serve(t, s), obs
}

// testOpenAI is the official Go client for the router at url, without
// retries (a retry would hide the answer under test).
func testOpenAI(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
}

func longSystem(words int) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "rule %d: answer precisely and cite the policy section. ", i)
	}
	return b.String()
}

func ask(sys, q string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: e2eModel, MaxTokens: openai.Int(6),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage(q)}}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestE2EOpenAIClient(t *testing.T) {
	engines := startEngines(t, 3, nil)
	_, c, obs := startE2E(t, engines, nil)
	resp, err := c.Chat.Completions.New(ctxT(t), ask("be brief", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.PromptTokens == 0 {
		t.Fatalf("response %+v", resp)
	}
	p := ask("be brief", "stream please")
	p.StreamOptions.IncludeUsage = openai.Bool(true)
	st := c.Chat.Completions.NewStreaming(ctxT(t), p)
	var chunks int
	var text strings.Builder
	var usage openai.CompletionUsage
	for st.Next() {
		ch := st.Current()
		chunks++
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
		if ch.Usage.PromptTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 || text.Len() == 0 || usage.CompletionTokens == 0 {
		t.Fatalf("stream: %d chunks, text %q, usage %+v", chunks, text.String(), usage)
	}
	// Completions and models through the same client.
	cr, err := c.Completions.New(ctxT(t), openai.CompletionNewParams{Model: e2eModel,
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}, MaxTokens: openai.Int(4)})
	if err != nil || len(cr.Choices) == 0 {
		t.Fatalf("completion: %v %+v", err, cr)
	}
	ms, err := c.Models.List(ctxT(t))
	if err != nil || len(ms.Data) != 1 || ms.Data[0].ID != e2eModel {
		t.Fatalf("models: %v %+v", err, ms)
	}
	// Unknown model: the client sees a 404 model_not_found.
	_, err = c.Chat.Completions.New(ctxT(t), openai.ChatCompletionNewParams{Model: "nope",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
	if n := len(obs.counts()); n == 0 {
		t.Fatal("observer saw nothing")
	}
}

func TestE2ESharedPrefixSameReplicaAndCached(t *testing.T) {
	engines := startEngines(t, 3, nil)
	// Probes that time out after 20 ms (e2eConfig) take a replica out on a
	// loaded machine (two in a row, under -race): the prefix's home, out
	// for one request, sent the next to another replica. This test is
	// about routing, so its probes have the defaults' patience.
	_, c, obs := startE2E(t, engines, func(cfg *slowpath.Config) {
		cfg.Health.Interval, cfg.Health.Timeout = time.Second, time.Second
	})
	sys := longSystem(80) // ~4 KB: many 64-token blocks
	var cached []int64
	for i := range 8 {
		if i%2 == 0 {
			r, err := c.Chat.Completions.New(ctxT(t), ask(sys, fmt.Sprintf("question %d?", i)))
			if err != nil {
				t.Fatal(err)
			}
			cached = append(cached, r.Usage.PromptTokensDetails.CachedTokens)
			continue
		}
		p := ask(sys, fmt.Sprintf("question %d, streamed?", i))
		p.StreamOptions.IncludeUsage = openai.Bool(true)
		st := c.Chat.Completions.NewStreaming(ctxT(t), p)
		var got int64 = -1
		for st.Next() {
			if u := st.Current().Usage; u.PromptTokens > 0 {
				got = u.PromptTokensDetails.CachedTokens
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		cached = append(cached, got)
	}
	counts := obs.counts()
	if len(counts) != 1 {
		obs.mu.Lock()
		t.Fatalf("requests sharing a system prompt spread over %d replicas: %v\nper request: replica %v predicted cached %v engine cached %v predicted TTFT %v",
			len(counts), counts, obs.reps, obs.pred, obs.got, obs.pttft)
	}
	for i, ct := range cached[1:] {
		if ct <= 0 {
			t.Fatalf("request %d: cached_tokens = %d, want > 0 (all: %v)", i+1, ct, cached)
		}
	}
	// The router learned the real hits from the engine (incl. the streamed
	// usage chunk) and predicted a cached prefix for the follow-ups.
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for i := 1; i < len(obs.got); i++ {
		if obs.got[i] <= 0 || obs.pred[i] <= 0 {
			t.Fatalf("request %d: observer saw predicted %d actual %d", i, obs.pred[i], obs.got[i])
		}
	}
}

func TestE2EOverloadedHomeSpreads(t *testing.T) {
	// A small batch makes queueing real: the home of the shared prefix
	// fills up. Each request's own uncached part (a long unique question)
	// outweighs the shared prefix, so once the home's queue is long, waiting
	// there costs more than recomputing the prefix elsewhere.
	engines := startEngines(t, 3, func(c *enginesim.Config) {
		c.MaxNumSeqs = 2
		c.OutputLen = enginesim.OutputLen{Median: 64, Sigma: 0.1, Min: 48, Max: 80}
		c.TimeScale = 0.1 // ~50 ms per request: the burst outpaces the home even under -race
	})
	_, c, obs := startE2E(t, engines, nil)
	sys := longSystem(20)
	if _, err := c.Chat.Completions.New(ctxT(t), ask(sys, "warm up")); err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	home := obs.reps[0]
	obs.mu.Unlock()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 24 {
		wg.Go(func() {
			p := ask(sys, fmt.Sprintf("burst %d: %s", i, longSystem(100)))
			p.MaxTokens = openai.Int(64)
			if _, err := c.Chat.Completions.New(ctxT(t), p); err != nil {
				failed.Add(1)
				t.Log(err)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d requests failed", failed.Load())
	}
	counts := obs.counts()
	if len(counts) < 2 {
		t.Fatalf("an overloaded home (%s) kept every request: %v", home, counts)
	}
	if counts[home] == 0 {
		t.Fatalf("the prefix home %s got nothing of the burst: %v", home, counts)
	}
	// How much stays home is the policy's trade-off (affinity tests it);
	// slowpath's job is that the ranking is followed under load.
	t.Logf("spread under overload: %v (home %s)", counts, home)
}

func TestE2EReplicaKilledMidRun(t *testing.T) {
	engines := startEngines(t, 3, nil)
	s, c, obs := startE2E(t, engines, func(cfg *slowpath.Config) { cfg.Routing.Policy = "round-robin" })
	victim := engines[1]
	for i := range 45 {
		if i == 15 {
			victim.Close()
		}
		if i%3 == 0 {
			p := ask("be brief", fmt.Sprintf("q%d", i))
			st := c.Chat.Completions.NewStreaming(ctxT(t), p)
			n := 0
			for st.Next() {
				n++
			}
			if err := st.Err(); err != nil || n == 0 {
				t.Fatalf("request %d (stream): %v, %d chunks", i, err, n)
			}
			continue
		}
		if _, err := c.Chat.Completions.New(ctxT(t), ask("be brief", fmt.Sprintf("q%d", i))); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	for _, st := range s.Replicas() {
		if st.Name == victim.Addr() && st.Healthy {
			t.Fatalf("killed replica still healthy: %+v", st)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for i, r := range obs.reps[15:] {
		if r == victim.Addr() {
			t.Fatalf("request %d after the kill was answered by the dead replica", 15+i)
		}
	}
}

func TestE2EStreamingIsIncremental(t *testing.T) {
	// An engine that sends its first chunk, then holds the rest until the
	// client has read that chunk: a router that buffered the stream would
	// never deliver it, and the client would see no chunk at all.
	release := make(chan struct{})
	var releaseOnce sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return // health and metrics: 200, empty
		}
		w.Header().Set("Content-Type", "text/event-stream")
		event := func(i int) {
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", e2eModel, i)
			w.(http.Flusher).Flush()
		}
		event(0)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		for i := 1; i < 20; i++ {
			event(i)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }); up.Close() })
	cfg := e2eConfig(nil)
	cfg.Replicas = []slowpath.ReplicaConfig{{Address: strings.TrimPrefix(up.URL, "http://"), Models: []string{e2eModel}}}
	_, url, _ := startObserved(t, cfg)
	c := testOpenAI(url)
	st := c.Chat.Completions.NewStreaming(ctxT(t), ask("be brief", "a long answer please"))
	n := 0
	for st.Next() {
		if n == 0 {
			releaseOnce.Do(func() { close(release) })
		}
		n++
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Fatalf("%d chunks, want 20", n)
	}
}

func TestE2EReloadUnderLoad(t *testing.T) {
	engines := startEngines(t, 3, nil)
	cfgFile := filepath.Join(t.TempDir(), "warmpath.yaml")
	writeCfg := func(eng ...*enginesim.Server) {
		t.Helper()
		var b strings.Builder
		b.WriteString("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nreload_interval: 20ms\nhealth: {interval: 20ms, timeout: 20ms}\nscrape: {interval: 20ms, timeout: 20ms, stale_after: 200ms}\nreplicas:\n")
		for _, en := range eng {
			fmt.Fprintf(&b, "  - address: %s\n    models: [%s]\n", en.Addr(), e2eModel)
		}
		// Write-then-rename: the watcher never sees a half-written file.
		tmp := cfgFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfgFile); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(engines[0], engines[1])
	s, err := slowpath.StartFromFile(cfgFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	obs := &routed{}
	s.Observer = obs
	url := serve(t, s)
	c := testOpenAI(url)

	var stop atomic.Bool
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := 0; i < 400 && !stop.Load(); i++ {
				p := ask("be brief", fmt.Sprintf("w%d q%d", w, i))
				p.MaxTokens = openai.Int(4)
				if _, err := c.Chat.Completions.New(ctxT(t), p); err != nil {
					failed.Add(1)
					t.Logf("worker %d request %d: %v", w, i, err)
					continue
				}
				ok.Add(1)
			}
		})
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for range 1000 {
			if cond() {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		t.Fatalf("timed out waiting for %s", what)
	}
	waitUntil("load running", func() bool { return ok.Load() > 10 })
	writeCfg(engines[0], engines[1], engines[2]) // add
	waitUntil("added replica serving", func() bool { return obs.counts()[engines[2].Addr()] > 3 })
	writeCfg(engines[1], engines[2]) // remove engines[0]
	waitUntil("removed replica gone", func() bool { return len(s.Replicas()) == 2 })
	obs.mu.Lock()
	mark := len(obs.reps)
	obs.mu.Unlock()
	before := ok.Load()
	waitUntil("load after removal", func() bool { return ok.Load() > before+20 })
	stop.Store(true)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed across reloads", failed.Load(), ok.Load()+failed.Load())
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	// A request routed just before the removal may complete after it; give
	// the in-flight ones (at most one per worker) slack.
	late := 0
	for _, r := range obs.reps[mark:] {
		if r == engines[0].Addr() {
			late++
		}
	}
	if late > 3 {
		t.Fatalf("removed replica kept getting requests: %d after removal", late)
	}
}
