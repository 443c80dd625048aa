package slowpath

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/tenant"
)

// tenantEngine is a tiny engine for the tenants tests: it answers JSON
// with usage.prompt_tokens = PromptTokens (no usage when negative), holds
// a request whose body contains "hold" until release, and records the
// arrival order of the others' "tag" markers and their headers.
type tenantEngine struct {
	addr         string
	PromptTokens atomic.Int64
	mu           sync.Mutex
	order        []string
	auth         []string
	held         atomic.Int64
	release      chan struct{}
	relOnce      sync.Once
	srv          *fasthttp.Server
	ln           net.Listener
}

func startTenantEngine(t *testing.T) *tenantEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &tenantEngine{addr: ln.Addr().String(), release: make(chan struct{}), ln: ln}
	e.PromptTokens.Store(10)
	e.srv = &fasthttp.Server{Handler: e.handle}
	go e.srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() {
		e.open()
		_ = e.srv.Shutdown()
	})
	return e
}

func (e *tenantEngine) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/health":
		ctx.SetBodyString("ok")
		return
	case "/metrics":
		ctx.SetStatusCode(404)
		return
	}
	body := string(ctx.PostBody())
	if strings.Contains(body, "hold") {
		e.held.Add(1)
		<-e.release
	}
	if i := strings.Index(body, "tag-"); i >= 0 {
		j := strings.IndexAny(body[i:], " \"")
		e.mu.Lock()
		e.order = append(e.order, body[i:i+j])
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.auth = append(e.auth, string(ctx.Request.Header.Peek("Authorization")))
	e.mu.Unlock()
	ctx.SetContentType("application/json")
	if n := e.PromptTokens.Load(); n >= 0 {
		fmt.Fprintf(ctx, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":3,"total_tokens":%d}}`, n, n+3)
		return
	}
	fmt.Fprint(ctx, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
}

// open lets held requests go (idempotent).
func (e *tenantEngine) open() { e.relOnce.Do(func() { close(e.release) }) }

func (e *tenantEngine) arrivals() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.order...)
}

func (e *tenantEngine) lastAuth() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.auth) == 0 {
		return "<none>"
	}
	return e.auth[len(e.auth)-1]
}

// writeKeys writes a keys file (mode 0600) into dir.
func writeKeys(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func keyEntry(key, tenantName, prio string) string {
	s := "  - sha256: " + tenant.HashKey(key) + "\n    tenant: " + tenantName + "\n"
	if prio != "" {
		s += "    priority: " + prio + "\n"
	}
	return s
}

type tresp struct {
	status int
	body   string
	hdr    http.Header
}

func tpost(t *testing.T, base, key, body string, hdr ...string) tresp {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return tresp{}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Error(err)
		return tresp{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return tresp{resp.StatusCode, string(b), resp.Header}
}

func tbody(tag string, promptChars int) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + tag + " " + strings.Repeat("x", promptChars) + `"}],"max_tokens":8}`
}

// TestTenantAuth: without a valid key 401 in OpenAI's shape (raw and
// through openai-go), the key never reaches the engine unless
// forward_key, /v1/models needs a key too.
func TestTenantAuth(t *testing.T) {
	for _, forward := range []bool{false, true} {
		t.Run("forward_key="+strconv.FormatBool(forward), func(t *testing.T) {
			e := startTenantEngine(t)
			keys := filepath.Join(t.TempDir(), "keys.yaml")
			writeKeys(t, keys, "keys:\n"+keyEntry("sk-alpha", "alpha", ""))
			cfg := testConfig(e.addr)
			cfg.Tenants.KeysFile = keys
			cfg.Tenants.ForwardKey = forward
			_, base := newTestServer(t, cfg)

			const noKey = `{"error":{"message":"You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
			const badKey = `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
			if r := tpost(t, base, "", chatBody); r.status != 401 || r.body != noKey || r.hdr.Get("Content-Type") != "application/json" {
				t.Fatalf("no key: %d %s", r.status, r.body)
			}
			if r := tpost(t, base, "sk-wrong", chatBody); r.status != 401 || r.body != badKey {
				t.Fatalf("bad key: %d %s", r.status, r.body)
			}
			if r := tpost(t, base, "", chatBody, "Authorization", "sk-alpha"); r.status != 401 {
				t.Fatalf("key without Bearer: %d", r.status)
			}
			if len(e.arrivals()) != 0 || e.held.Load() != 0 {
				t.Fatal("an unauthenticated request reached the engine")
			}
			if r := tpost(t, base, "sk-alpha", chatBody); r.status != 200 {
				t.Fatalf("good key: %d %s", r.status, r.body)
			}
			want := "" // fasthttp's Peek of an absent header
			if forward {
				want = "Bearer sk-alpha"
			}
			if got := e.lastAuth(); got != want {
				t.Fatalf("engine saw Authorization %q, want %q", got, want)
			}
			// /v1/models
			req, _ := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 401 {
				t.Fatalf("/v1/models without key: %d", resp.StatusCode)
			}
			// Every API path but /health needs a key, the Responses API
			// and the pass-through endpoints included.
			for _, path := range []string{"/v1/responses", "/tokenize", "/v1/rerank", "/version"} {
				req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{"model":"m","input":"hi","prompt":"hi"}`))
				if path == "/version" {
					req.Method = http.MethodGet
				}
				resp, err := testClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 401 || !strings.Contains(string(b), `"code":"invalid_api_key"`) {
					t.Fatalf("%s without key: %d %s", path, resp.StatusCode, b)
				}
			}
			if resp, err := testClient.Get(base + "/health"); err != nil || resp.StatusCode != 200 {
				t.Fatalf("/health needs no key: %v", err)
			} else {
				resp.Body.Close()
			}
			// The official client sees an *openai.Error with the code.
			c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-wrong"), option.WithMaxRetries(0))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" || apiErr.Type != "invalid_request_error" {
				t.Fatalf("openai-go: %v", err)
			}
			good := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("sk-alpha"), option.WithMaxRetries(0))
			if _, err := good.Models.List(ctx); err != nil {
				t.Fatalf("openai-go models with a key: %v", err)
			}
		})
	}
}

// TestTenantSalt: the tenant is the cache salt (two keys of one tenant
// share it, another tenant differs); salt: key gives each key its own; a
// body's own cache_salt is refused under a tenant salt.
func TestTenantSalt(t *testing.T) {
	for _, mode := range []string{TenantSaltTenant, TenantSaltKey} {
		t.Run(mode, func(t *testing.T) {
			fe := startFakeEngine(t)
			keys := filepath.Join(t.TempDir(), "keys.yaml")
			writeKeys(t, keys, "keys:\n"+keyEntry("sk-a1", "a", "")+keyEntry("sk-a2", "a", "")+keyEntry("sk-b", "b", ""))
			cfg := testConfig(fe.addr)
			cfg.Tenants.KeysFile = keys
			cfg.Tenants.Salt = mode
			_, base := newTestServer(t, cfg)
			salt := func(key string) string {
				t.Helper()
				if r := tpost(t, base, key, chatBody); r.status != 200 {
					t.Fatalf("%s: %d %s", key, r.status, r.body)
				}
				b := string(fe.lastBody())
				i := strings.Index(b, `"cache_salt":"`)
				if i < 0 || strings.Contains(b, key) {
					t.Fatalf("body %s", b)
				}
				return b[i : i+48]
			}
			a1, a2, b := salt("sk-a1"), salt("sk-a2"), salt("sk-b")
			if a1 == b || (mode == TenantSaltTenant) != (a1 == a2) {
				t.Fatalf("salts a1 %s a2 %s b %s", a1, a2, b)
			}
			own := `{"model":"m","cache_salt":"` + a1[14:46] + `","messages":[{"role":"user","content":"x"}]}`
			if r := tpost(t, base, "sk-b", own); r.status != 400 || !strings.Contains(r.body, `"param":"cache_salt"`) {
				t.Fatalf("own cache_salt: %d %s", r.status, r.body)
			}
		})
	}
}

// TestTenantBudgets: a tenant at its limit gets 429 with Retry-After and
// the limit's name while another tenant is served; the engine's usage
// corrects the estimate; max_concurrent counts requests in flight.
func TestTenantBudgets(t *testing.T) {
	e := startTenantEngine(t)
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	writeKeys(t, keys, `tenants:
  small:
    input_tokens_per_minute: 1500
    output_tokens_per_minute: 100
    max_concurrent: 1
  big:
    input_tokens_per_minute: 100000
keys:
`+keyEntry("sk-small", "small", "")+keyEntry("sk-big", "big", ""))
	cfg := testConfig(e.addr)
	cfg.Tenants.KeysFile = keys
	s, base := newTestServer(t, cfg)

	// ~1000 estimated prompt tokens; the engine reports none: the
	// estimate stands.
	e.PromptTokens.Store(-1)
	if r := tpost(t, base, "sk-small", tbody("tag-s1", 4000)); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := tpost(t, base, "sk-small", tbody("tag-s2", 4000))
	ra, _ := strconv.Atoi(r.hdr.Get("Retry-After"))
	if r.status != 429 || !strings.Contains(r.body, "input_tokens_per_minute") || !strings.Contains(r.body, `"code":"rate_limit_exceeded"`) || ra < 1 || ra > 60 {
		t.Fatalf("over budget: %d Retry-After %q %s", r.status, r.hdr.Get("Retry-After"), r.body)
	}
	if r := tpost(t, base, "sk-big", tbody("tag-b1", 4000)); r.status != 200 {
		t.Fatalf("other tenant: %d %s", r.status, r.body)
	}
	// The output budget: max_tokens over it is refused outright.
	big := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`
	if r := tpost(t, base, "sk-small", big); r.status != 429 || !strings.Contains(r.body, "output_tokens_per_minute") {
		t.Fatalf("output: %d %s", r.status, r.body)
	}
	// Correction: the engine reports 10 prompt tokens for a ~1000-token
	// estimate, so the tenant's usage is the report, not the estimate.
	e.PromptTokens.Store(10)
	before, _ := s.ten.ledger.Used("big", s.now())
	if r := tpost(t, base, "sk-big", tbody("tag-b2", 4000)); r.status != 200 {
		t.Fatalf("big: %d", r.status)
	}
	after, _ := s.ten.ledger.Used("big", s.now())
	if after.In-before.In != 10 || after.Out-before.Out != 3 || after.InFlight != 0 {
		t.Fatalf("usage not corrected: before %+v after %+v", before, after)
	}
	// max_concurrent: one request of small held at the engine, the next
	// is refused with Retry-After: 1.
	writeKeys(t, keys, `tenants:
  small:
    max_concurrent: 1
keys:
`+keyEntry("sk-small", "small", ""))
	waitFor(t, "keys reload", func() bool { return s.ten.keys.Load().Tenant("big") == nil })
	done := make(chan tresp, 1)
	go func() { done <- tpost(t, base, "sk-small", tbody("hold", 10)) }()
	waitFor(t, "held request", func() bool { return e.held.Load() == 1 })
	if r := tpost(t, base, "sk-small", tbody("tag-s3", 10)); r.status != 429 || r.hdr.Get("Retry-After") != "1" || !strings.Contains(r.body, "max_concurrent") {
		t.Fatalf("concurrency: %d %q %s", r.status, r.hdr.Get("Retry-After"), r.body)
	}
	e.open()
	if r := <-done; r.status != 200 {
		t.Fatalf("held: %d", r.status)
	}
	if r := tpost(t, base, "sk-small", tbody("tag-s4", 10)); r.status != 200 {
		t.Fatalf("after release: %d %s", r.status, r.body)
	}
	m := scrapeAdmin(t, s)
	if !strings.Contains(m, `warmpath_slowpath_tenant_budget_rejected_total{limit="input_tokens_per_minute",tenant="small"} 1`) {
		t.Fatalf("metrics:\n%s", grepLines(m, "tenant_budget"))
	}
}

// TestTenantKeysReload: a key added to the file works within a reload
// interval; a broken file keeps the running keys; a removed key is
// refused.
func TestTenantKeysReload(t *testing.T) {
	e := startTenantEngine(t)
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	writeKeys(t, keys, "keys:\n"+keyEntry("sk-one", "one", ""))
	cfg := testConfig(e.addr)
	cfg.Tenants.KeysFile = keys
	s, base := newTestServer(t, cfg)
	if r := tpost(t, base, "sk-two", chatBody); r.status != 401 {
		t.Fatalf("unknown key: %d", r.status)
	}
	writeKeys(t, keys, "keys:\n"+keyEntry("sk-one", "one", "")+keyEntry("sk-two", "two", ""))
	waitFor(t, "new key accepted", func() bool { return tpost(t, base, "sk-two", chatBody).status == 200 })
	writeKeys(t, keys, "keys:\n  - sha256: nothex\n")
	waitFor(t, "bad file counted", func() bool {
		return strings.Contains(scrapeAdmin(t, s), `warmpath_slowpath_keys_reloads_total{result="error"} 1`)
	})
	if r := tpost(t, base, "sk-two", chatBody); r.status != 200 {
		t.Fatalf("a bad file dropped the running keys: %d", r.status)
	}
	writeKeys(t, keys, "keys:\n"+keyEntry("sk-one", "one", ""))
	waitFor(t, "removed key refused", func() bool { return tpost(t, base, "sk-two", chatBody).status == 401 })
}

// queueServer is one replica capped at one request in flight with the
// fair queue on; the slot is held by a "hold" request until release.
func queueServer(t *testing.T, keysYAML string, mutate func(*Config)) (*tenantEngine, *Server, string, chan tresp) {
	t.Helper()
	e := startTenantEngine(t)
	cfg := testConfig(e.addr)
	cfg.Replicas[0].MaxInFlight = 1
	cfg.Tenants.Queue.Enabled = true
	if keysYAML != "" {
		keys := filepath.Join(t.TempDir(), "keys.yaml")
		writeKeys(t, keys, keysYAML)
		cfg.Tenants.KeysFile = keys
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, base := newTestServer(t, cfg)
	held := make(chan tresp, 1)
	key := ""
	if keysYAML != "" {
		key = "sk-hold"
	}
	go func() { held <- tpost(t, base, key, tbody("hold", 10)) }()
	waitFor(t, "slot held", func() bool { return e.held.Load() == 1 })
	return e, s, base, held
}

func queued(s *Server) int {
	return int(s.fq.queued.Load())
}

// TestFairQueuePriority: a high-class request overtakes a queued low one.
func TestFairQueuePriority(t *testing.T) {
	e, s, base, held := queueServer(t, "", nil)
	res := make(chan tresp, 3)
	go func() { res <- tpost(t, base, "", tbody("tag-low", 10), "X-Warmpath-Priority", "low") }()
	waitFor(t, "low queued", func() bool { return queued(s) == 1 })
	go func() { res <- tpost(t, base, "", tbody("tag-normal", 10)) }()
	waitFor(t, "normal queued", func() bool { return queued(s) == 2 })
	go func() { res <- tpost(t, base, "", tbody("tag-high", 10), "X-Warmpath-Priority", "high") }()
	waitFor(t, "high queued", func() bool { return queued(s) == 3 })
	if r := tpost(t, base, "", tbody("tag-bad", 10), "X-Warmpath-Priority", "urgent"); r.status != 400 {
		t.Fatalf("bad priority: %d %s", r.status, r.body)
	}
	if !strings.Contains(scrapeAdmin(t, s), `warmpath_slowpath_queue_length{class="low"} 1`) {
		t.Fatal("queue_length not exported")
	}
	e.open()
	for range 3 {
		if r := <-res; r.status != 200 {
			t.Fatalf("queued request: %d %s", r.status, r.body)
		}
	}
	<-held
	if got := strings.Join(e.arrivals(), " "); got != "tag-high tag-normal tag-low" {
		t.Fatalf("served order %q", got)
	}
	if m := scrapeAdmin(t, s); !strings.Contains(m, `warmpath_slowpath_queue_wait_seconds_count{class="high"} 1`) {
		t.Fatalf("wait histogram:\n%s", grepLines(m, "queue_wait"))
	}
}

// TestFairQueueTenants: one tenant floods the queue, the other's single
// request is served next-but-one (not after the flood), takes a flooder's
// place when the queue is full, and a key's class caps the header.
func TestFairQueueTenants(t *testing.T) {
	keys := "keys:\n" + keyEntry("sk-hold", "hold", "") + keyEntry("sk-flood", "flood", "") + keyEntry("sk-quiet", "quiet", "low")
	e, s, base, held := queueServer(t, keys, func(c *Config) { c.Tenants.Queue.MaxLength, c.Tenants.Queue.Quantum = 8, 16 })
	res := make(chan tresp, 32)
	for i := range 8 {
		go func() { res <- tpost(t, base, "sk-flood", tbody(fmt.Sprintf("tag-f%d", i), 40)) }()
		waitFor(t, "flood queued", func() bool { return queued(s) == i+1 })
	}
	// The queue is full of the flooder's: its ninth is refused...
	if r := tpost(t, base, "sk-flood", tbody("tag-f8", 40)); r.status != 429 || !strings.Contains(r.body, "is full") {
		t.Fatalf("flood over the bound: %d %s", r.status, r.body)
	}
	// ...the quiet tenant asks for high but its key caps it at low: a
	// separate class queue, so it does not displace anyone.
	go func() { res <- tpost(t, base, "sk-quiet", tbody("tag-quiet-low", 40), "X-Warmpath-Priority", "high") }()
	waitFor(t, "quiet queued in low", func() bool { return s.fq.length(2) == 1 })
	// A normal-class request of the quiet tenant (header lowers nothing
	// past its key's class, so it uses a hold-tenant key here: another
	// tenant) displaces the flooder's newest.
	go func() { res <- tpost(t, base, "sk-hold", tbody("tag-other", 40)) }()
	var shed tresp
	select {
	case shed = <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("no request shed")
	}
	if shed.status != 429 || !strings.Contains(shed.body, "Tenant `flood` is over its share") {
		t.Fatalf("shed: %d %s", shed.status, shed.body)
	}
	e.open()
	for range 9 {
		if r := <-res; r.status != 200 {
			t.Fatalf("queued: %d %s", r.status, r.body)
		}
	}
	<-held
	order := e.arrivals()
	pos := map[string]int{}
	for i, tag := range order {
		pos[tag] = i
	}
	// DRR's bound: the flooder gets at most one quantum plus one request
	// ahead of the other tenant (FIFO would serve it after all 7).
	if pos["tag-other"] > 2 {
		t.Fatalf("the other tenant waited behind the flood: %v", order)
	}
	if pos["tag-quiet-low"] != len(order)-1 {
		t.Fatalf("low class served before normal: %v", order)
	}
	m := scrapeAdmin(t, s)
	for _, want := range []string{
		`warmpath_slowpath_queue_shed_total{class="normal",reason="queue_full",tenant="flood"} 1`,
		`warmpath_slowpath_queue_shed_total{class="normal",reason="tenant_share",tenant="flood"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Fatalf("missing %s in\n%s", want, grepLines(m, "queue_shed"))
		}
	}
}

// TestFairQueueTimeout: past tenants.queue.timeout a queued request gets
// 503 queue_timeout and leaves the queue.
func TestFairQueueTimeout(t *testing.T) {
	e, s, base, held := queueServer(t, "", func(c *Config) { c.Tenants.Queue.Timeout = 200 * time.Millisecond })
	r := tpost(t, base, "", tbody("tag-late", 10))
	if r.status != 503 || !strings.Contains(r.body, `"code":"queue_timeout"`) || r.hdr.Get("Retry-After") != "1" {
		t.Fatalf("deadline: %d %s", r.status, r.body)
	}
	if queued(s) != 0 {
		t.Fatalf("timed-out request still queued: %d", queued(s))
	}
	e.open()
	<-held
	if r := tpost(t, base, "", tbody("tag-after", 10)); r.status != 200 {
		t.Fatalf("after: %d", r.status)
	}
}

func scrapeAdmin(t *testing.T, s *Server) string {
	t.Helper()
	rec := &adminRecorder{h: http.Header{}}
	req, _ := http.NewRequest(http.MethodGet, "/metrics", nil)
	s.AdminHandler().ServeHTTP(rec, req)
	return rec.b.String()
}

type adminRecorder struct {
	h    http.Header
	b    strings.Builder
	code int
}

func (r *adminRecorder) Header() http.Header         { return r.h }
func (r *adminRecorder) Write(p []byte) (int, error) { return r.b.Write(p) }
func (r *adminRecorder) WriteHeader(c int)           { r.code = c }

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestTenantSideChannel: against simulated engines (which honour
// cache_salt), with tenants.salt none tenant B confirms tenant A's secret
// prompt through cached_tokens; with the default salt (tenant) it cannot,
// while each tenant still hits its own cache.
func TestTenantSideChannel(t *testing.T) {
	secret := strings.Repeat("tenant a's confidential system prompt, many blocks long ", 60)
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + secret + `"}]}`
	for _, tc := range []struct {
		salt      string
		wantCross bool
	}{{TenantSaltNone, true}, {TenantSaltTenant, false}} {
		t.Run(tc.salt, func(t *testing.T) {
			// One engine: where the probe lands is the router's business
			// (checked below with Decide); the engine's answer is the leak.
			addrs := simEngines(t, 1)
			keys := filepath.Join(t.TempDir(), "keys.yaml")
			writeKeys(t, keys, "keys:\n"+keyEntry("sk-a", "a", "")+keyEntry("sk-b", "b", ""))
			cfg := testConfig(addrs...)
			cfg.Tenants.KeysFile = keys
			cfg.Tenants.Salt = tc.salt
			s, base := newTestServer(t, cfg)
			a := map[string]string{"Authorization": "Bearer sk-a"}
			b := map[string]string{"Authorization": "Bearer sk-b"}
			if st, _ := tenantPost(t, base, body, a); st != 200 {
				t.Fatalf("status %d", st)
			}
			if st, cached := tenantPost(t, base, body, a); st != 200 || cached == 0 {
				t.Fatalf("tenant a again: status %d cached %d, want a hit", st, cached)
			}
			// The router's view of B's probe (as it hashes it): a predicted
			// hit is what sends the probe to the replica holding A's prompt.
			probe := []byte(body)
			if tc.salt == TenantSaltTenant {
				sum := sha256.Sum256([]byte("warmpath tenant\x00b"))
				probe = []byte(strings.TrimSuffix(body, "}") + `,"cache_salt":"` + hex.EncodeToString(sum[:16]) + `"}`)
			}
			var p affinity.Prompt
			if err := affinity.NewParser(s.Router().HashConfig()).ParseChat(probe, &p); err != nil {
				t.Fatal(err)
			}
			var d affinity.Decision
			if err := s.Router().Decide(&affinity.Request{Model: p.Model, Hashes: p.Hashes, PromptTokens: p.Tokens, Now: s.Now()}, &d); err != nil {
				t.Fatal(err)
			}
			if got := d.CachedTokens[0]; (got > 0) != tc.wantCross {
				t.Fatalf("router predicts %d cached tokens for b's probe, want the side channel open=%v", got, tc.wantCross)
			}
			// The probe: B sends A's prompt.
			st, cached := tenantPost(t, base, body, b)
			if st != 200 || (cached > 0) != tc.wantCross {
				t.Fatalf("tenant b's probe: status %d cached %d, want the side channel open=%v", st, cached, tc.wantCross)
			}
		})
	}
}

// TestFairQueueReserve: with tenants.queue.reserve 1 on a model of 2
// slots, a tenant holding 1 waits for its second although a slot is
// free, and another tenant's request takes that slot at once.
func TestFairQueueReserve(t *testing.T) {
	keys := "keys:\n" + keyEntry("sk-hold", "flood", "") + keyEntry("sk-quiet", "quiet", "")
	e, s, base, held := queueServer(t, keys, func(c *Config) {
		c.Replicas[0].MaxInFlight = 2
		c.Tenants.Queue.Reserve = 1
	})
	res := make(chan tresp, 1)
	go func() { res <- tpost(t, base, "sk-hold", tbody("tag-flood2", 10)) }()
	waitFor(t, "flood's second queued at its share", func() bool { return queued(s) == 1 })
	if r := tpost(t, base, "sk-quiet", tbody("tag-quiet", 10)); r.status != 200 {
		t.Fatalf("quiet: %d %s", r.status, r.body)
	}
	if got := strings.Join(e.arrivals(), " "); got != "tag-quiet" {
		t.Fatalf("engine saw %q before the hold ended, want only the quiet request", got)
	}
	e.open()
	if r := <-res; r.status != 200 {
		t.Fatalf("flood's second: %d %s", r.status, r.body)
	}
	<-held
	if got := strings.Join(e.arrivals(), " "); got != "tag-quiet tag-flood2" {
		t.Fatalf("order %q", got)
	}
}

// TestTenantsConfig: each bad tenants field is refused naming the field
// and its line; a missing, unparsable or world-writable keys file stops
// New with the file's error.
func TestTenantsConfig(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"tenants:\n  salt: bogus\n", "line 2: tenants.salt: must be tenant, key or none"},
		{"tenants:\n  default_max_tokens: -1\n", "line 2: tenants.default_max_tokens: must be in [0, 16777216]"},
		{"tenants:\n  priority_header: \"\"\n", "line 2: tenants.priority_header: must be a header name"},
		{"tenants:\n  queue:\n    max_length: 0\n", "line 3: tenants.queue.max_length: must be in [1, 1048576]"},
		{"tenants:\n  queue:\n    timeout: 0s\n", "line 3: tenants.queue.timeout: must be > 0"},
		{"tenants:\n  queue:\n    quantum: 0\n", "line 3: tenants.queue.quantum: must be in [1, 16777216]"},
		{"tenants:\n  queue:\n    reserve: -1\n", "line 3: tenants.queue.reserve: must be in [0, 1048576]"},
		{"tenants:\n  queue:\n    headroom: -1\n", "line 3: tenants.queue.headroom: must be in [0, 1048576]"},
		{"tenants:\n  queue:\n    headroom_min: 0\n", "line 3: tenants.queue.headroom_min: must be in [1, headroom (1)], got 0"},
		{"tenants:\n  queue:\n    headroom: 2\n    headroom_min: 3\n", "line 4: tenants.queue.headroom_min: must be in [1, headroom (2)], got 3"},
		{"tenants:\n  queue:\n    active_window: 0s\n", "line 3: tenants.queue.active_window: must be in (0s, 1h]"},
		{"tenancy:\n  salt_from: header\ntenants:\n  keys_file: /x\n", "line 4: tenants.keys_file: tenancy.salt_from must be none"},
		{"tenants:\n  bogus: 1\n", "line 2: tenants.bogus: unknown field"},
	} {
		if _, err := ParseConfig([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeKeys(t, bad, "keys:\n  - sha256: 12\n    tenant: a\n")
	open := filepath.Join(dir, "open.yaml")
	writeKeys(t, open, "keys: []\n")
	if err := os.Chmod(open, 0o666); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "missing.yaml"): "no such file",
		bad:                                "line 2: keys[0].sha256: must be 64 hex digits",
		open:                               "world-writable",
	} {
		cfg := testConfig()
		cfg.Tenants.KeysFile = path
		if s, err := New(cfg, testLogger(t)); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "tenants.keys_file") {
			if s != nil {
				s.stopLoops()
			}
			t.Errorf("%s: got %v, want %q", path, err, want)
		}
	}
}

// TestTenantUsageParse: the engine's usage is read from chat and
// completions answers, a stream's usage chunk and Responses answers (the
// last "usage" object; nothing when absent or malformed).
func TestTenantUsageParse(t *testing.T) {
	l := tenant.NewLedger(time.Second)
	for _, tc := range []struct {
		body    string
		in, out int64
	}{
		{`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`, 12, 5},
		{`{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}`, 3, 0},
		{`{"type":"response.completed","response":{"usage":{"input_tokens":40,"output_tokens":9,"total_tokens":49}}}`, 40, 9},
		{`{"choices":[{"delta":{"content":"usage"}}]}`, -1, -1},
		{`{"usage":{"prompt_tokens":"x"}}`, -1, -1},
		{`{"usage":{"prompt_tokens":7`, -1, -1},
	} {
		ex := &exchange{}
		ex.ten.reset()
		if _, ok := l.Admit("t", tenant.Budget{}, 1, 1, 0, &ex.ten.ticket); !ok {
			t.Fatal("admit")
		}
		ex.promptRep, ex.outTok = usageTokens(&ex.fjParser, []byte(tc.body))
		ex.tenantCharge()
		if ex.ten.in != tc.in || ex.ten.out != tc.out {
			t.Errorf("%s: got %d/%d, want %d/%d", tc.body, ex.ten.in, ex.ten.out, tc.in, tc.out)
		}
		l.End(&ex.ten.ticket, -1, -1, 0)
	}
}

// TestFairQueueClientGone: a queued request whose client closes its
// connection leaves the queue (counted) and never reaches the engine.
func TestFairQueueClientGone(t *testing.T) {
	e, s, base, held := queueServer(t, "", nil)
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := tbody("tag-gone", 10)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitFor(t, "queued", func() bool { return queued(s) == 1 })
	c.Close()
	waitFor(t, "left the queue", func() bool { return queued(s) == 0 })
	waitFor(t, "counted", func() bool {
		return strings.Contains(scrapeAdmin(t, s), `warmpath_slowpath_queue_shed_total{class="normal",reason="client_gone",tenant=""} 1`)
	})
	e.open()
	<-held
	if r := tpost(t, base, "", tbody("tag-after", 10)); r.status != 200 {
		t.Fatalf("after: %d", r.status)
	}
	if got := strings.Join(e.arrivals(), " "); got != "tag-after" {
		t.Fatalf("engine saw %q", got)
	}
}

// TestFairQueueGrantsNoMoreThanFree: a kick grants turns only up to the
// free slots of the model's replicas, counting the turns whose waiters have
// not taken them yet. Granting more let a later waiter take the one free
// slot while an earlier one's goroutine had not run (a loaded machine),
// serving a normal-class request after the low class (seen as a
// TestFairQueueTenants failure under CPU contention).
func TestFairQueueGrantsNoMoreThanFree(t *testing.T) {
	e := startTenantEngine(t)
	cfg := testConfig(e.addr)
	cfg.Replicas[0].MaxInFlight = 1
	cfg.Tenants.Queue.Enabled = true
	s, _ := newTestServer(t, cfg)
	q := s.fq
	model := cfg.Replicas[0].Models[0]
	var ws []*waiter
	for _, name := range []string{"first", "second"} {
		ex := &exchange{model: []byte(model)}
		ex.ten.name, ex.ten.est = name, 10
		w, ok := q.push(ex)
		if !ok {
			t.Fatal("push refused")
		}
		ws = append(ws, w)
	}
	granted := func(w *waiter) bool {
		select {
		case <-w.ch:
			return true
		default:
			return false
		}
	}
	q.kick()
	q.kick() // a second signal (another request's end) before the first waiter runs
	if !granted(ws[0]) {
		t.Fatal("the first waiter got no turn")
	}
	if granted(ws[1]) {
		t.Fatal("two turns for one free slot: the second waiter may take it first")
	}
	q.taken(ws[0])
	q.requeue(ws[0]) // it found no room after all: back at the head
	q.kick()
	if !granted(ws[0]) || granted(ws[1]) {
		t.Fatal("the requeued waiter did not get the next turn")
	}
	q.taken(ws[0])
	q.kick()
	if !granted(ws[1]) {
		t.Fatal("the second waiter got no turn once the first took its own")
	}
}
