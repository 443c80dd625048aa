package slowpath

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAccessLogJSON: with log.access set to a file and log.format json,
// every request gets one line that parses as JSON with its client, model,
// replica, status, TTFT, the engine's token counts and duration, and no
// line holds the prompt text or the Authorization value. The token
// throughput counters and the inter-token latency histogram count the same
// answers.
func TestAccessLogJSON(t *testing.T) {
	e := startFakeEngine(t)
	path := filepath.Join(t.TempDir(), "access.log")
	cfg := testConfig(e.addr)
	cfg.Log = LogConfig{Format: LogFormatJSON, Access: path}
	s, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln) //nolint:errcheck
	url := "http://" + ln.Addr().String()
	const secretPrompt, secretKey = "SECRET-PROMPT-7f3a", "sk-SECRET-9b1c"
	send := func(body string) int {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+secretKey)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	codes := []int{
		send(`{"model":"m","messages":[{"role":"user","content":"` + secretPrompt + ` plain"}]}`),
		send(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + secretPrompt + ` stream"}]}`),
		send(`{"model":"nope","messages":[{"role":"user","content":"` + secretPrompt + `"}]}`),
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 404 {
		t.Fatalf("statuses %v", codes)
	}
	if v := metricValue(t, s, "warmpath_slowpath_prompt_tokens_total", "replica", e.addr); v != 20 {
		t.Errorf("prompt_tokens_total %v, want 20", v)
	}
	if v := metricValue(t, s, "warmpath_slowpath_output_tokens_total", "replica", e.addr); v != 2+3 {
		t.Errorf("output_tokens_total %v, want 5", v)
	}
	mfs, _ := s.reg.Gather()
	var itl uint64
	for _, mf := range mfs {
		if mf.GetName() == "warmpath_slowpath_inter_token_latency_seconds" {
			for _, m := range mf.GetMetric() {
				itl += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if itl != 1 {
		t.Errorf("inter_token_latency_seconds samples %d, want 1 (the stream)", itl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secretPrompt)) || bytes.Contains(raw, []byte(secretKey)) || bytes.Contains(raw, []byte("Bearer")) {
		t.Fatalf("access log holds a secret:\n%s", raw)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), raw)
	}
	for i, want := range []map[string]any{
		{"model": "m", "replica": e.addr, "status": 200.0, "prompt_tokens": 10.0, "output_tokens": 2.0, "cached_tokens": 7.0},
		{"model": "m", "replica": e.addr, "status": 200.0, "prompt_tokens": 10.0, "output_tokens": 3.0, "cached_tokens": 7.0},
		{"model": "", "replica": "none", "status": 404.0, "error": "model_not_found"},
	} {
		l := lines[i]
		for k, v := range want {
			if l[k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, l[k], v, l)
			}
		}
		for _, k := range []string{"time", "client", "duration_ms"} {
			if _, ok := l[k]; !ok {
				t.Errorf("line %d has no %s: %v", i, k, l)
			}
		}
		if c, _ := l["client"].(string); !strings.HasPrefix(c, "127.0.0.1:") {
			t.Errorf("line %d: client %q", i, c)
		}
		if _, ok := l["ttft_ms"]; ok != (i < 2) {
			t.Errorf("line %d: ttft_ms present %v", i, ok)
		}
		// The router's expectation: on routed lines only.
		for _, k := range []string{"predicted_ttft_ms", "predicted_cached_tokens", "busy_at_start"} {
			v, ok := l[k]
			if ok != (i < 2) {
				t.Errorf("line %d: %s present %v", i, k, ok)
			}
			if f, _ := v.(float64); ok && (f < 0 || k == "predicted_ttft_ms" && f == 0) {
				t.Errorf("line %d: %s = %v", i, k, v)
			}
		}
	}
}

// TestLogHandlerJSON: the json format writes one JSON object per record.
func TestLogHandlerJSON(t *testing.T) {
	var b bytes.Buffer
	l := slog.New(NewLogHandler(&b, LogFormatJSON, slog.LevelInfo))
	l.Info("hello", "k", "v \" quoted\nnewline")
	l.With("component", "x").Warn("again", "n", 3)
	sc := bufio.NewScanner(&b)
	n := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("%d lines", n)
	}
}
