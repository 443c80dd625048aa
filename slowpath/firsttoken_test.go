package slowpath

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestRolePreamble(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       bool
	}{
		{"vllm role chunk", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, true},
		{"openai role chunk", `{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}`, true},
		{"role without content", `{"choices":[{"delta":{"role":"assistant"}}]}`, true},
		{"role with null content", `{"choices":[{"delta":{"role":"assistant","content":null}}]}`, true},
		{"role with spaced empty content", `{"choices":[{"delta":{"role": "assistant", "content" : ""}}]}`, true},
		{"role with the first token", `{"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}`, false},
		{"role with spaced token", `{"choices":[{"delta":{"role":"assistant","content": "Hi"}}]}`, false},
		{"content chunk", `{"choices":[{"delta":{"content":"Hi"}}]}`, false},
		{"completion text", `{"choices":[{"text":"Hi","index":0}]}`, false},
		{"token quoting role", `{"choices":[{"delta":{"content":"\"role\""}}]}`, false},
		{"usage chunk", `{"choices":[],"usage":{"prompt_tokens":10}}`, false},
		{"done", `[DONE]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rolePreamble([]byte(tc.data)); got != tc.want {
				t.Fatalf("rolePreamble(%s) = %v, want %v", tc.data, got, tc.want)
			}
		})
	}
}

// TestFirstTokenAfterRoleChunk: an engine that sends the chat role chunk at
// once and the first token only after prefill (enginesim does) must not
// look like an instantaneous prefill: the first token is the first event
// with output. Timed at the first byte, the live bench fitted prefill rates
// 600x too high and the cost policy spread shared prefixes everywhere.
func TestFirstTokenAfterRoleChunk(t *testing.T) {
	const prefill = 100 * time.Millisecond
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			w.WriteHeader(http.StatusOK)
			return
		}
		fl := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		fl.Flush()
		time.Sleep(prefill)
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n")
		fl.Flush()
	}))
	t.Cleanup(eng.Close)
	s, url := newTestServer(t, testConfig(eng.Listener.Addr().String()))
	code, body := post(t, url+"/v1/chat/completions", "application/json",
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there"}]}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "warmpath_slowpath_ttft_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 1 {
			t.Fatalf("ttft samples = %d, want 1", h.GetSampleCount())
		}
		if got := h.GetSampleSum(); got < prefill.Seconds() {
			t.Fatalf("ttft = %.4fs, want >= %v: timed at the role chunk, not the first token", got, prefill)
		}
		return
	}
	t.Fatal("no warmpath_slowpath_ttft_seconds metric")
}
