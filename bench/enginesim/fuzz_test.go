package enginesim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzAPIRequest posts arbitrary bodies to both completion endpoints: the
// server must answer 200 with a well-formed body or an OpenAI error, never
// panic.
func FuzzAPIRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":2}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"x"}]},{"role":"tool","content":"r"}],"tools":[{"type":"function"}],"max_completion_tokens":1}`,
		`{"model":"m","prompt":"hello","max_tokens":2,"cache_salt":"s"}`,
		`{"model":"m","prompt":[1,2,3,4294967295],"max_tokens":1,"stream":true}`,
		`{"model":"m","prompt":["x"]}`,
		`{"model":"m","messages":[]}`,
		`{"model":"lora","messages":[{"role":"user","content":"\u0000\ud800"}],"n":1,"temperature":0,"top_p":1}`,
		`[]`, `null`, `{"model":"m","max_tokens":1e400}`, `{"model":"m","messages":[{"role":"user","content":{}}]}`,
	}
	for _, s := range seeds {
		f.Add(s, true)
		f.Add(s, false)
	}
	s := fuzzServer(f, "lora")
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		out := rec.Body.Bytes()
		switch {
		case rec.Code == http.StatusOK && strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream"):
			if !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) {
				t.Fatalf("stream without [DONE]: %q", out)
			}
			for ev := range bytes.SplitSeq(bytes.TrimSuffix(out, []byte("\n\n")), []byte("\n\n")) {
				data, ok := bytes.CutPrefix(ev, []byte("data: "))
				if !ok || (!bytes.Equal(data, []byte("[DONE]")) && !json.Valid(data)) {
					t.Fatalf("bad event %q", ev)
				}
			}
		case rec.Code == http.StatusOK:
			var resp struct {
				Choices []json.RawMessage
				Usage   *usage
			}
			if err := json.Unmarshal(out, &resp); err != nil || len(resp.Choices) != 1 || resp.Usage == nil {
				t.Fatalf("bad response %q", out)
			}
		case rec.Code == 400 || rec.Code == 404 || rec.Code == 413:
			var e struct {
				Error *struct{ Message, Type string }
			}
			if err := json.Unmarshal(out, &e); err != nil || e.Error == nil || e.Error.Message == "" {
				t.Fatalf("status %d without an OpenAI error: %q", rec.Code, out)
			}
		default:
			t.Fatalf("status %d: %q", rec.Code, out)
		}
	})
}
