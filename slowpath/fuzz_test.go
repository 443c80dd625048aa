package slowpath

import (
	"bytes"
	"testing"
)

// FuzzHandler feeds arbitrary bodies to the routed endpoints (Responses
// and pass-through included): the router
// must answer 200 (proxied), 400 or 404 (unknown model) with a JSON body,
// never panic, and leave no slot taken.
func FuzzHandler(f *testing.F) {
	for _, s := range []string{
		string(benchBody),
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","input":"x"}`,
		`{"model":"zz","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function"}]}`,
		`{"model":"m","stream":true,"messages":[]}`,
		`{"model":"m","instructions":"i","input":[{"role":"user","content":"x"}],"previous_response_id":"x"}`,
		`{"model":"m","input":"x","previous_response_id":"nope"}`,
		`{"prompt":"x"}`, `{"model":"m","query":"q","documents":["d"]}`,
		`[]`, `{`, `{"model":null}`, "\x00",
	} {
		for ep := range 6 {
			f.Add(uint8(ep), []byte(s))
		}
	}
	h := newHandlerRig(f)
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/tokenize", "/v1/rerank"}
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		if bytes.Contains(body, []byte(`"stream"`)) {
			return // the rig reads buffered answers only
		}
		h.ctx.Request.SetRequestURI(paths[int(ep)%len(paths)])
		h.ctx.Request.SetBody(body)
		h.ctx.Response.Reset()
		h.s.handle(&h.ctx)
		switch st := h.ctx.Response.StatusCode(); st {
		case 200, 400, 404:
		default:
			t.Fatalf("status %d for %q: %s", st, body, h.ctx.Response.Body())
		}
		if b := h.ctx.Response.Body(); len(b) == 0 || b[0] != '{' {
			t.Fatalf("non-JSON answer %q", b)
		}
		if n := h.s.inflight.Load(); n != 0 {
			t.Fatalf("%d slots leaked", n)
		}
	})
}
