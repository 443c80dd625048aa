package slowpath

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
)

// The files in testdata/llamacpp were captured from llama.cpp's
// llama-server b11669 (Debian sid llama.cpp-tools 0.7.0) by bench/llamacpp.
func llamaSample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/llamacpp/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParsePropsLlamaCpp(t *testing.T) {
	p, err := parseProps(llamaSample(t, "props.json"))
	if err != nil {
		t.Fatal(err)
	}
	if p != (engineProps{TotalSlots: 2, SlotContext: 8192}) {
		t.Fatalf("props %+v, want 2 slots of 8192 tokens", p)
	}
	for _, bad := range []string{`{}`, `{"total_slots":0}`, `{"total_slots":-4}`, `{"total_slots":"4"}`, `not json`, `{"total_slots":1e9}`} {
		if _, err := parseProps([]byte(bad)); err == nil {
			t.Errorf("parseProps(%s): no error", bad)
		}
	}
}

func TestUsageJSONLlamaCppTimings(t *testing.T) {
	var p exchange
	var o affinity.Outcome
	if c := usageJSON(&p.fjParser, llamaSample(t, "chat.json"), &o); c != 1037 {
		t.Fatalf("cached %d, want 1037", c)
	}
	want := affinity.Outcome{PrefillTokens: 44, PrefillSeconds: 0.014762, DecodeSeconds: 0.009635}
	if o != want {
		t.Fatalf("timings %+v, want %+v", o, want)
	}
	// timings.cache_n stands in when usage has no cached_tokens.
	o = affinity.Outcome{}
	if c := usageJSON(&p.fjParser, []byte(`{"usage":{"prompt_tokens":9},"timings":{"cache_n":5,"prompt_n":4,"prompt_ms":2}}`), &o); c != 5 {
		t.Fatalf("cache_n fallback: %d, want 5", c)
	}
	if o.PrefillTokens != 4 || o.PrefillSeconds != 0.002 || o.DecodeSeconds != 0 {
		t.Fatalf("timings %+v", o)
	}
	// Hostile timings are ignored, not trusted.
	o = affinity.Outcome{}
	if c := usageJSON(&p.fjParser, []byte(`{"timings":{"cache_n":-3,"prompt_n":"x","prompt_ms":-1,"predicted_ms":1e300}}`), &o); c != 0 || o != (affinity.Outcome{}) {
		t.Fatalf("hostile timings: cached %d, %+v", c, o)
	}
}

// The streamed answer's final event carries usage and timings: the scanner
// finds both however the stream is split.
func TestSSEScanLlamaCppStream(t *testing.T) {
	stream := llamaSample(t, "chat-stream.txt")
	for _, size := range []int{1, 7, 64, 4096, len(stream)} {
		ex := &exchange{cached: -1}
		for i := 0; i < len(stream); i += size {
			ex.scan(stream[i:min(i+size, len(stream))])
		}
		if ex.cached != 1037 || ex.timings.PrefillTokens != 44 || ex.timings.DecodeSeconds == 0 {
			t.Fatalf("split %d: cached %d, timings %+v", size, ex.cached, ex.timings)
		}
	}
}

// fakeLlama serves llama.cpp's /metrics and /props (the captured samples)
// and an OpenAI answer with timings; it counts /props reads.
type fakeLlama struct {
	addr  string
	props atomic.Int64
	slots atomic.Int64
}

func startFakeLlama(t *testing.T) *fakeLlama {
	t.Helper()
	chat := llamaSample(t, "chat.json")
	return startFakeLlamaWith(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(chat)
	})
}

// startFakeLlamaWith is startFakeLlama with chat answering
// /v1/chat/completions.
func startFakeLlamaWith(t *testing.T, chat fasthttp.RequestHandler) *fakeLlama {
	t.Helper()
	f := &fakeLlama{}
	metrics, props, slots := llamaSample(t, "metrics.txt"), llamaSample(t, "props.json"), llamaSample(t, "slots-used.json")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health":
			ctx.SetBodyString(`{"status":"ok"}`)
		case "/metrics":
			ctx.SetBody(metrics)
		case "/props":
			f.props.Add(1)
			ctx.SetContentType("application/json")
			ctx.SetBody(props)
		case "/slots":
			f.slots.Add(1)
			ctx.SetContentType("application/json")
			ctx.SetBody(slots)
		case "/v1/chat/completions":
			chat(ctx)
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return f
}

// TestLlamaCppDiscovery: warmpath reads a llama.cpp engine's batch slots from
// /props once (not at every scrape) and hands them to the cost policy, and a
// buffered answer's timings feed the replica's prefill rate and slot time.
func TestLlamaCppDiscovery(t *testing.T) {
	e := startFakeLlama(t)
	cfg := testConfig(e.addr)
	access := filepath.Join(t.TempDir(), "access.log")
	cfg.Log = LogConfig{Format: LogFormatJSON, Access: access}
	s, url := newTestServer(t, cfg)
	waitFor(t, "batch slots from /props", func() bool {
		st := replicaStatus(t, s, e.addr)
		return st.Engine.BatchSlots == 2 && st.Affinity != nil && st.Affinity.BatchSlots == 2
	})
	if st := replicaStatus(t, s, e.addr); st.Engine.SlotContext != 8192 {
		t.Fatalf("slot context %d, want 8192", st.Engine.SlotContext)
	}
	// /slots, read with /props: one of the two slots ran a request.
	if st := replicaStatus(t, s, e.addr); st.Engine.FreshSlots != 1 {
		t.Fatalf("fresh slots %d, want 1 (slots-used.json)", st.Engine.FreshSlots)
	}
	for range 3 {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 || !strings.Contains(body, "cache_n") {
			t.Fatalf("%d %s", st, body)
		}
	}
	st := replicaStatus(t, s, e.addr)
	// 44 tokens in 14.762 ms, then 9.635 ms decoding in the slot.
	if r := st.Affinity.EnginePrefillPerSec; r < 2900 || r > 3100 {
		t.Fatalf("engine prefill rate %.0f, want 44 / 14.762 ms = 2981", r)
	}
	if d := st.Affinity.SlotSeconds; d < 0.0095 || d > 0.0097 {
		t.Fatalf("slot seconds %.4f, want the decode, 0.0096", d)
	}
	// The access log shows the engine's own prefill beside the TTFT.
	var lines []map[string]any
	waitFor(t, "3 access log lines", func() bool {
		raw, _ := os.ReadFile(access)
		lines = lines[:0]
		for l := range bytes.Lines(raw) {
			var m map[string]any
			if json.Unmarshal(l, &m) == nil {
				lines = append(lines, m)
			}
		}
		return len(lines) == 3
	})
	for i, l := range lines {
		if l["engine_prefill_tokens"] != 44.0 || l["engine_prefill_ms"] != 14.762 {
			t.Fatalf("access line %d: engine_prefill_tokens %v, engine_prefill_ms %v, want 44 and 14.762 (%v)",
				i, l["engine_prefill_tokens"], l["engine_prefill_ms"], l)
		}
	}
	time.Sleep(10 * testConfig().Scrape.Interval) // several more scrapes
	if n := e.props.Load(); n != 1 {
		t.Fatalf("/props read %d times, want once per engine start", n)
	}
	if n := e.slots.Load(); n != 1 {
		t.Fatalf("/slots read %d times, want once, with /props", n)
	}
}

// TestParseSlotsLlamaCpp: a slot that never ran a task (no
// n_prompt_tokens) and runs nothing counts as fresh.
func TestParseSlotsLlamaCpp(t *testing.T) {
	for name, want := range map[string]int{"slots-idle.json": 2, "slots-used.json": 1, "slots-busy.json": 1} {
		if n, err := parseSlots(llamaSample(t, name)); err != nil || n != want {
			t.Errorf("%s: %d fresh (%v), want %d", name, n, err, want)
		}
	}
	if _, err := parseSlots([]byte(`{"error":"not supported"}`)); err == nil {
		t.Error("an object: no error")
	}
}
