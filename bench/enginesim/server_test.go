package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const testModel = "sim-llama"

func startServer(t *testing.T, mutate func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ServedModelNames = []string{testModel, "alias"}
	cfg.LoRAModules = []string{"sql-lora=/adapters/sql"}
	cfg.NumGPUBlocks = 4096
	cfg.TimeScale = 0.05
	cfg.Logger = discardLogger()
	cfg.EnableAdmin = true // the fault and restart tests use it; "admin off by default" sets it back
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t *testing.T, s *Server) openai.Client {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return openai.NewClient(option.WithBaseURL("http://"+s.Addr()+"/v1/"), option.WithAPIKey("test"),
		option.WithMaxRetries(0), option.WithHTTPClient(hc), option.WithRequestTimeout(30*time.Second))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// longSystem is a system prompt of about n tokens.
func longSystem(n int) string { return string(prompt("You are a careful assistant. ", n)) }

type streamResult struct {
	content string
	chunks  int
	ttft    time.Duration
	usage   openai.CompletionUsage
	finish  string
}

func streamChat(t *testing.T, c openai.Client, params openai.ChatCompletionNewParams) streamResult {
	t.Helper()
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	start := time.Now()
	st := c.Chat.Completions.NewStreaming(ctxT(t), params)
	defer st.Close()
	var res streamResult
	for st.Next() {
		ch := st.Current()
		if ch.Usage.PromptTokens > 0 {
			res.usage = ch.Usage
		}
		for _, choice := range ch.Choices {
			if choice.Delta.Content != "" {
				if res.chunks == 0 {
					res.ttft = time.Since(start)
				}
				res.chunks++
				res.content += choice.Delta.Content
			}
			if choice.FinishReason != "" {
				res.finish = choice.FinishReason
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return res
}

func TestChatWithOpenAIClient(t *testing.T) {
	s := startServer(t, func(c *Config) { c.TimeScale = 0.5 })
	c := newClient(t, s)
	sys := longSystem(6000)
	ask := func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage(q)}}
	}
	first := streamChat(t, c, ask("What is a KV cache?"))
	second := streamChat(t, c, ask("And prefix caching?"))
	for i, r := range []streamResult{first, second} {
		if r.chunks != 8 || len(r.content) != 32 || r.finish != "length" || r.usage.CompletionTokens != 8 {
			t.Errorf("stream %d: %d chunks, %q, finish %q, usage %+v", i, r.chunks, r.content, r.finish, r.usage)
		}
	}
	if first.usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("cold request reports %d cached tokens", first.usage.PromptTokensDetails.CachedTokens)
	}
	cached := second.usage.PromptTokensDetails.CachedTokens
	if cached < 6000 || cached >= second.usage.PromptTokens {
		t.Errorf("second request cached %d of %d prompt tokens, want the system prompt's ~6000", cached, second.usage.PromptTokens)
	}
	t.Logf("TTFT cold %v (0 cached), warm %v (%d cached)", first.ttft, second.ttft, cached)
	if !(second.ttft < first.ttft) {
		t.Errorf("cached TTFT %v not below cold TTFT %v", second.ttft, first.ttft)
	}

	// Non-streaming, same prefix, sampled length.
	p := ask("Third question")
	p.MaxTokens = param.Opt[int64]{}
	resp, err := c.Chat.Completions.New(ctxT(t), p)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	ch := resp.Choices[0]
	if resp.Model != testModel || ch.Message.Role != "assistant" || ch.Message.Content == "" || ch.FinishReason != "stop" {
		t.Errorf("response %+v", resp)
	}
	if u := resp.Usage; u.PromptTokensDetails.CachedTokens < 6000 || u.TotalTokens != u.PromptTokens+u.CompletionTokens ||
		int64(len(ch.Message.Content)) != 4*(u.CompletionTokens-1) {
		t.Errorf("usage %+v for %d bytes of content", u, len(ch.Message.Content))
	}
	if got := s.Served(testModel); got != 3 {
		t.Errorf("Served(%q) = %d, want 3", testModel, got)
	}
}

func TestCompletionsWithOpenAIClient(t *testing.T) {
	s := startServer(t, nil)
	c := newClient(t, s)
	p := openai.CompletionNewParams{Model: "alias", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(longSystem(500))},
		MaxTokens: openai.Int(5)}
	resp, err := c.Completions.New(ctxT(t), p)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if resp.Object != "text_completion" || len(resp.Choices[0].Text) != 20 || resp.Choices[0].FinishReason != "length" || resp.Usage.PromptTokens != 500 {
		t.Errorf("completion %+v", resp)
	}
	p.StreamOptions.IncludeUsage = openai.Bool(true)
	st := c.Completions.NewStreaming(ctxT(t), p)
	defer st.Close()
	var text string
	var u openai.CompletionUsage
	for st.Next() {
		cur := st.Current()
		for _, ch := range cur.Choices {
			text += ch.Text
		}
		if cur.Usage.PromptTokens > 0 {
			u = cur.Usage
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text != resp.Choices[0].Text && len(text) != 20 {
		t.Errorf("streamed %q", text)
	}
	if u.PromptTokensDetails.CachedTokens != 496 {
		t.Errorf("streamed usage %+v, want 496 cached tokens", u)
	}
	if s.Served("alias") != 2 {
		t.Errorf("served alias %d, want 2", s.Served("alias"))
	}
}

func TestModelsAndHealth(t *testing.T) {
	s := startServer(t, nil)
	c := newClient(t, s)
	page, err := c.Models.List(ctxT(t))
	if err != nil {
		t.Fatalf("models: %v", err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != testModel+",alias,sql-lora" {
		t.Errorf("models %v", ids)
	}
	if code, _ := get(t, s, "/health"); code != http.StatusOK {
		t.Errorf("health %d", code)
	}
}

func get(t *testing.T, s *Server, path string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr()+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func post(t *testing.T, s *Server, path, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func parseMetrics(t *testing.T, body []byte) (map[string]float64, error) {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model_name"] != testModel {
				t.Errorf("%s: model_name %q", name, labels["model_name"])
			}
			key := name
			switch {
			case name == "vllm:cache_config_info":
				key = fmt.Sprintf("%s{block_size=%s,num_gpu_blocks=%s}", name, labels["block_size"], labels["num_gpu_blocks"])
			case labels["finished_reason"] != "":
				key = name + "{" + labels["finished_reason"] + "}"
			case labels["kind"] != "":
				key = name + "{" + labels["kind"] + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
				out[key+"_sum"] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out, nil
}

func TestMetrics(t *testing.T) {
	s := startServer(t, nil)
	c := newClient(t, s)
	sys := longSystem(300)
	var wantTTFT time.Duration // model time: each request finds the engine idle
	tm := DefaultTiming()
	for i := range 2 {
		resp, err := c.Chat.Completions.New(ctxT(t), openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(3),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage(fmt.Sprint("q", i))}})
		if err != nil {
			t.Fatalf("chat: %v", err)
		}
		u := resp.Usage
		c, n := int64(u.PromptTokensDetails.CachedTokens), int64(u.PromptTokens-u.PromptTokensDetails.CachedTokens)
		wantTTFT += tm.StepBase + time.Duration(n)*tm.PerPrefillToken + time.Duration((n*c+n*(n+1)/2)*int64(tm.PerPrefillKPairs)/1000)
	}
	code, body := get(t, s, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("metrics %d", code)
	}
	m, err := parseMetrics(t, body)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, body)
	}
	want := map[string]float64{
		"vllm:num_requests_waiting":                                 0,
		"vllm:num_requests_running":                                 0,
		"vllm:kv_cache_usage_perc":                                  0,
		"vllm:cache_config_info{block_size=16,num_gpu_blocks=4096}": 1,
		"vllm:time_to_first_token_seconds_count":                    2,
		"vllm:request_success_total{length}":                        2,
		"vllm:e2e_request_latency_seconds_count":                    2,
		"vllm:generation_tokens_total":                              6,
		"warmpath_enginesim_restarts_total":                         0,
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	if got := m["vllm:time_to_first_token_seconds_sum"]; math.Abs(got-wantTTFT.Seconds()) > 1e-9 {
		t.Errorf("TTFT sum %vs, want the modelled %vs", got, wantTTFT.Seconds())
	}
	if !(m["vllm:prefix_cache_hits_total"] >= 300 && m["vllm:prefix_cache_queries_total"] > m["vllm:prefix_cache_hits_total"]) {
		t.Errorf("prefix cache counters: hits %v queries %v", m["vllm:prefix_cache_hits_total"], m["vllm:prefix_cache_queries_total"])
	}
}

func TestSeveralServersInOneProcess(t *testing.T) {
	a, b := startServer(t, nil), startServer(t, nil)
	if a.Addr() == b.Addr() {
		t.Fatal("same address")
	}
	for _, s := range []*Server{a, b} {
		code, body := get(t, s, "/metrics")
		if _, err := parseMetrics(t, body); code != 200 || err != nil {
			t.Errorf("%s: %d %v", s.Addr(), code, err)
		}
	}
}

func TestBadRequests(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxModelLen = 1000 })
	long := strings.Repeat("x", 4*1000)
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		param  any // nil: JSON null
	}{
		{"not json", "/v1/chat/completions", `{"model":`, 400, nil},
		{"empty body", "/v1/chat/completions", ``, 400, nil},
		{"trailing data", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}]} {}`, 400, nil},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404, "model"},
		{"model wrong type", "/v1/chat/completions", `{"model":7,"messages":[]}`, 400, "model"},
		{"no messages", "/v1/chat/completions", `{"model":"sim-llama"}`, 400, "messages"},
		{"messages wrong type", "/v1/chat/completions", `{"model":"sim-llama","messages":"hi"}`, 400, "messages"},
		{"bad role", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages[0].role"},
		{"image part", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "messages[0].content"},
		{"null user content", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":null}]}`, 400, "messages[0].content"},
		{"max_tokens zero", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, 400, "max_tokens"},
		{"max_tokens string", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":"5"}`, 400, "max_tokens"},
		{"max_completion_tokens negative", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":-1}`, 400, "max_completion_tokens"},
		{"n two", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"n":2}`, 400, "n"},
		{"temperature", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"temperature":3}`, 400, "temperature"},
		{"top_p", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"top_p":0}`, 400, "top_p"},
		{"empty cache_salt", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"cache_salt":""}`, 400, "cache_salt"},
		{"stream_options without stream", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, 400, "stream_options"},
		{"tools not array", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"tools":{}}`, 400, "tools"},
		{"prompt too long", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"` + long + `"}]}`, 400, "messages"},
		{"max_tokens too long", "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":995}`, 400, "max_tokens"},
		{"completion no prompt", "/v1/completions", `{"model":"sim-llama"}`, 400, "prompt"},
		{"completion two prompts", "/v1/completions", `{"model":"sim-llama","prompt":["a","b"]}`, 400, "prompt"},
		{"completion prompt object", "/v1/completions", `{"model":"sim-llama","prompt":{"a":1}}`, 400, "prompt"},
		{"completion bad token id", "/v1/completions", `{"model":"sim-llama","prompt":[-1]}`, 400, "prompt"},
		{"completion empty prompt", "/v1/completions", `{"model":"sim-llama","prompt":""}`, 400, "prompt"},
		{"completion max_tokens too long", "/v1/completions", `{"model":"sim-llama","prompt":"hi","max_tokens":1000}`, 400, "max_tokens"},
		{"unknown path", "/v1/embeddings", `{}`, 404, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, s, tc.path, tc.body)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, body)
			}
			var e struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
				t.Fatalf("not an OpenAI error body: %s", body)
			}
			if msg, _ := e.Error["message"].(string); msg == "" || e.Error["type"] == "" {
				t.Errorf("error without message/type: %s", body)
			}
			if p, ok := e.Error["param"]; !ok || p != tc.param {
				t.Errorf("param %v, want %v: %s", p, tc.param, body)
			}
		})
	}
	if code, _ := get(t, s, "/v1/chat/completions"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET chat: %d, want 405", code)
	}
	if st := s.Stats(); st.Engine.Submitted != 0 {
		t.Errorf("bad requests reached the engine: %d", st.Engine.Submitted)
	}
}

func TestLoRAAndCacheSalt(t *testing.T) {
	s := startServer(t, nil)
	body := func(model, salt string) string {
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2, "cache_salt": salt,
			"messages": []map[string]string{{"role": "system", "content": longSystem(200)}, {"role": "user", "content": "hi"}}})
		return string(b)
	}
	cached := func(model, salt string) int {
		t.Helper()
		code, b := post(t, s, "/v1/chat/completions", body(model, salt))
		var resp struct{ Usage usage }
		if err := json.Unmarshal(b, &resp); code != 200 || err != nil {
			t.Fatalf("status %d: %s", code, b)
		}
		return resp.Usage.PromptTokensDetails.CachedTokens
	}
	steps := []struct {
		model, salt string
		hit         bool
	}{
		{testModel, "s1", false},
		{testModel, "s1", true},
		{"alias", "s1", true}, // aliases are the same model
		{testModel, "s2", false},
		{"sql-lora", "s1", false},
		{"sql-lora", "s1", true},
	}
	for i, st := range steps {
		if got := cached(st.model, st.salt); (got > 0) != st.hit {
			t.Errorf("step %d (%s, %s): cached %d, want hit=%v", i, st.model, st.salt, got, st.hit)
		}
	}
	if s.Served("sql-lora") != 2 || s.Served("alias") != 1 {
		t.Errorf("served %+v", s.Stats().Served)
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	s := startServer(t, func(c *Config) { c.TimeScale = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	c := newClient(t, s)
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(5000),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me everything")}})
	for st.Next() {
		if st.Current().Choices[0].Delta.Content != "" {
			break
		}
	}
	cancel()
	st.Close()
	waitFor(t, "request aborted in the engine", func() bool {
		e := s.Stats().Engine
		return e.Aborted == 1 && e.Running == 0 && e.UsedBlocks == 0
	})
}

// waitFor polls cond (bounded: 10s) for effects of another goroutine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestFaults(t *testing.T) {
	chat := `{"model":"sim-llama","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	stream := `{"model":"sim-llama","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	t.Run("error rate", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.Faults.ErrorRate = 1; c.Faults.ErrorStatus = 503 })
		if code, body := post(t, s, "/v1/chat/completions", chat); code != 503 || !bytes.Contains(body, []byte("injected")) {
			t.Errorf("status %d: %s", code, body)
		}
		s.SetFaults(Faults{ErrorRate: 0.5})
		fails := 0
		for range 40 {
			if code, _ := post(t, s, "/v1/chat/completions", chat); code == 500 {
				fails++
			}
		}
		if fails == 0 || fails == 40 {
			t.Errorf("error rate 0.5 failed %d of 40", fails)
		}
		if got := s.Stats().FaultsInjected; got != int64(fails)+1 {
			t.Errorf("FaultsInjected %d, want %d", got, fails+1)
		}
	})
	t.Run("latency", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.Faults.Latency = 100 * time.Millisecond })
		if code, body := post(t, s, "/v1/chat/completions", chat); code != 200 {
			t.Errorf("status %d: %s", code, body)
		}
		_, body := get(t, s, "/metrics")
		m, _ := parseMetrics(t, body)
		if m["warmpath_enginesim_faults_injected_total{latency}"] != 1 {
			t.Errorf("latency fault not counted: %v", m)
		}
	})
	t.Run("hang", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.Faults.Hang = true })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(chat))
		_, err := http.DefaultClient.Do(req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("hung request returned %v", err)
		}
		if s.Stats().Engine.Submitted != 0 {
			t.Error("hung request reached the engine")
		}
	})
	t.Run("close mid-stream", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.Faults.CloseAfterChunks = 3 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(stream))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || bytes.Contains(body, []byte("[DONE]")) {
			t.Errorf("stream completed (err %v): %s", err, body)
		}
		if n := bytes.Count(body, []byte(`"content":"`)); n != 4 { // role chunk + 3
			t.Errorf("%d content chunks before the cut, want 1+3: %s", n, body)
		}
		waitFor(t, "aborted", func() bool { return s.Stats().Engine.Aborted == 1 })
	})
	t.Run("stall mid-stream", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.Faults.StallAfterChunks = 2 })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+"/v1/chat/completions", strings.NewReader(stream))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		defer resp.Body.Close()
		var got []byte
		buf := make([]byte, 4096)
		for bytes.Count(got, []byte(`"content":"`)) < 3 { // role chunk + 2
			n, err := resp.Body.Read(buf)
			if err != nil {
				t.Fatalf("read: %v after %s", err, got)
			}
			got = append(got, buf[:n]...)
		}
		waitFor(t, "stall injected", func() bool { return s.Stats().FaultsInjected == 1 })
		// The engine finishes generating; the client never sees the rest.
		waitFor(t, "engine finished", func() bool { return s.Stats().Engine.Finished == 1 })
		cancel()
		rest, err := io.ReadAll(resp.Body)
		got = append(got, rest...)
		if err == nil || bytes.Contains(got, []byte("[DONE]")) || bytes.Count(got, []byte(`"content":"`)) != 3 {
			t.Errorf("stalled stream (err %v) delivered: %s", err, got)
		}
	})
	t.Run("unhealthy and metrics faults", func(t *testing.T) {
		s := startServer(t, nil)
		code, _ := post(t, s, "/admin/faults", `{"unhealthy":true,"metrics_garbage":true}`)
		if code != 200 {
			t.Fatalf("admin faults %d", code)
		}
		if code, _ := get(t, s, "/health"); code != 503 {
			t.Errorf("health %d, want 503", code)
		}
		_, body := get(t, s, "/metrics")
		if _, err := parseMetrics(t, body); err == nil {
			t.Errorf("garbage metrics parsed: %s", body)
		}
		if code, _ := post(t, s, "/admin/faults", `{"metrics_stall":true}`); code != 200 {
			t.Fatal("admin faults")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr()+"/metrics", nil)
		if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("stalled metrics returned %v", err)
		}
		if code, _ := post(t, s, "/admin/faults", `{"error_rate":2}`); code != 400 {
			t.Errorf("invalid faults accepted: %d", code)
		}
		if code, _ := post(t, s, "/admin/faults", `{"bogus":1}`); code != 400 {
			t.Errorf("unknown fault field accepted: %d", code)
		}
		if code, _ := post(t, s, "/admin/faults", `{}`); code != 200 || s.Faults() != (Faults{}) {
			t.Errorf("clearing faults: %d %+v", code, s.Faults())
		}
		if code, _ := get(t, s, "/health"); code != 200 {
			t.Errorf("health after clear %d", code)
		}
	})
	t.Run("restart wipes the cache and cuts streams", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.TimeScale = 1 })
		withSys := `{"model":"sim-llama","max_tokens":2,"messages":[{"role":"system","content":"` + longSystem(100) + `"},{"role":"user","content":"x"}]}`
		cachedOf := func() int {
			_, b := post(t, s, "/v1/chat/completions", withSys)
			var resp struct{ Usage usage }
			json.Unmarshal(b, &resp)
			return resp.Usage.PromptTokensDetails.CachedTokens
		}
		cachedOf()
		if cachedOf() == 0 {
			t.Fatal("no cache hit before restart")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim-llama","max_tokens":5000,"stream":true,"messages":[{"role":"user","content":"long"}]}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		waitFor(t, "stream running", func() bool { return s.Stats().Engine.Running == 1 })
		if code, _ := post(t, s, "/admin/restart", ``); code != 200 {
			t.Fatalf("restart %d", code)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || bytes.Contains(body, []byte("[DONE]")) {
			t.Errorf("stream survived restart (err %v)", err)
		}
		if got := cachedOf(); got != 0 {
			t.Errorf("cached %d after restart, want 0", got)
		}
		if s.Stats().Restarts != 1 {
			t.Errorf("restarts %d", s.Stats().Restarts)
		}
	})
	t.Run("SetFaults clamps", func(t *testing.T) {
		s := startServer(t, nil)
		s.SetFaults(Faults{ErrorRate: math.NaN(), ErrorStatus: 200, Latency: -time.Second, CloseAfterChunks: -1})
		if got := s.Faults(); got != (Faults{}) {
			t.Errorf("clamped faults %+v, want zero", got)
		}
		s.SetFaults(Faults{ErrorRate: 7})
		if got := s.Faults().ErrorRate; got != 1 {
			t.Errorf("ErrorRate clamped to %v, want 1", got)
		}
	})
	t.Run("admin off by default", func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.EnableAdmin = DefaultConfig().EnableAdmin })
		for _, p := range []string{"/admin/restart", "/admin/faults"} {
			if code, _ := post(t, s, p, `{"hang":true}`); code != 404 {
				t.Errorf("POST %s with the default config: %d, want 404", p, code)
			}
		}
		if s.Faults() != (Faults{}) || s.Stats().Restarts != 0 {
			t.Errorf("default config took the admin calls: faults %+v, restarts %d", s.Faults(), s.Stats().Restarts)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error, "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"no names", func(c *Config) { c.ServedModelNames = nil }, "ServedModelNames"},
		{"duplicate lora", func(c *Config) { c.LoRAModules = []string{c.ServedModelNames[0] + "=/x"} }, "duplicate"},
		{"block size", func(c *Config) { c.BlockSize = 0 }, "BlockSize"},
		{"blocks", func(c *Config) { c.NumGPUBlocks = 0 }, "NumGPUBlocks"},
		{"seqs", func(c *Config) { c.MaxNumSeqs = 0 }, "MaxNumSeqs"},
		{"budget", func(c *Config) { c.MaxNumBatchedTokens = 0 }, "MaxNumBatchedTokens"},
		{"model len", func(c *Config) { c.MaxModelLen = 1 }, "MaxModelLen"},
		{"time scale", func(c *Config) { c.TimeScale = 0 }, "TimeScale"},
		{"timing", func(c *Config) { c.Timing = Timing{} }, "Timing"},
		{"output len", func(c *Config) { c.OutputLen.Min = 0 }, "OutputLen"},
		{"fault rate", func(c *Config) { c.Faults.ErrorRate = 1.5 }, "ErrorRate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want error containing %q", err, tc.want)
			}
		})
	}
}
