package slowpath

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestEngineTokensConverted: an engine whose tokenizer counts 10% fewer
// tokens than the router's bytes / 4 estimate, and holds every request's
// shared system prompt. Its usage.prompt_tokens reaches the router with
// the cached tokens, so the hits, compared in the router's tokens, all come
// true and the replica keeps full trust in them; compared as the engine
// counts them they fall 10% short of every prediction.
func TestEngineTokensConverted(t *testing.T) {
	var n int
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health": // a failing probe takes the only replica out on a slow run
			return
		case "/v1/chat/completions":
		default:
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		prompt := int(math.Round(0.9 * float64(len(body)) / 4))
		cached := 0
		if n++; n > 1 {
			cached = prompt - 16 // all but the question
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, prompt+1, cached)
	}))
	t.Cleanup(eng.Close)
	s, url := newTestServer(t, testConfig(eng.Listener.Addr().String()))
	sys := strings.Repeat("Our company's policies, products and tools. ", 100)
	for i := range 30 {
		code, body := post(t, url+"/v1/chat/completions", "application/json",
			fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d?"}]}`, sys, i))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
	}
	if c := s.Router().Replicas()[0].Confidence; c < 0.99 {
		t.Fatalf("confidence %.3f after 29 hits that came true, reported in a tokenizer 0.9x the estimate", c)
	}
}
