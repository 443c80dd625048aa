package slowpath

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestParserDifferential: bodies the router and the engine would read
// differently (a routing field twice, in another letter case, or a lax
// boolean `stream`) are refused with a 400 naming the field; none reaches
// the engine. Engines (vLLM, SGLang, llama.cpp, Go servers) take the last
// duplicate, Go ones match keys case-insensitively, and vLLM reads
// "stream":"true" and 1 as true.
func TestParserDifferential(t *testing.T) {
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.Replicas[0].Models = []string{"m-a", "m-b"}
	cfg.Tenancy.SaltFrom = SaltFromHeader
	_, url := newTestServer(t, cfg)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, path, body, param string
	}{
		{"model twice", "/v1/chat/completions", `{"model":"m-a","model":"m-b",` + msgs + `}`, "model"},
		{"model in another case", "/v1/chat/completions", `{"model":"m-a","Model":"m-b",` + msgs + `}`, "model"},
		{"model only in another case", "/v1/chat/completions", `{"MODEL":"m-b",` + msgs + `}`, "model"},
		{"stream twice", "/v1/chat/completions", `{"model":"m-a","stream":false,"stream":true,` + msgs + `}`, "stream"},
		{"stream with a long s", "/v1/chat/completions", `{"model":"m-a","ſtream":true,` + msgs + `}`, "stream"},
		{"stream as a string", "/v1/chat/completions", `{"model":"m-a","stream":"true",` + msgs + `}`, "stream"},
		{"stream as a number", "/v1/chat/completions", `{"model":"m-a","stream":1,` + msgs + `}`, "stream"},
		{"cache_salt then null", "/v1/chat/completions", `{"model":"m-a","cache_salt":"x","cache_salt":null,` + msgs + `}`, "cache_salt"},
		{"messages twice", "/v1/chat/completions", `{"model":"m-a",` + msgs + `,"messages":[{"role":"user","content":"other"}]}`, "messages"},
		{"prompt twice", "/v1/completions", `{"model":"m-a","prompt":"a","prompt":"b"}`, "prompt"},
		{"user in another case", "/v1/chat/completions", `{"model":"m-a","User":"u",` + msgs + `}`, "user"},
		{"max_tokens twice", "/v1/completions", `{"model":"m-a","prompt":"a","max_tokens":1,"max_tokens":100000}`, "max_tokens"},
		{"input twice", "/v1/embeddings", `{"model":"m-a","input":"a","input":"b"}`, "input"},
		{"include_usage twice", "/v1/chat/completions", `{"model":"m-a","stream":true,"stream_options":{"include_usage":true,"include_usage":false},` + msgs + `}`, "stream_options.include_usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, url+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Tenant", "t1")
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got struct {
				Error struct{ Message, Type, Param string }
			}
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest || got.Error.Param != tc.param || got.Error.Type != errTypeInvalid {
				t.Fatalf("got %d %+v, want 400 naming %q", resp.StatusCode, got.Error, tc.param)
			}
		})
	}
	if n := e.requests.Load(); n != 0 {
		t.Errorf("engine saw %d requests, want 0", n)
	}
	// Unambiguous bodies still pass, stream:null included.
	for _, b := range []string{
		`{"model":"m-a",` + msgs + `}`,
		`{"model":"m-a","stream":null,"Temperature":1,"extra_body":{"model":"x"},` + msgs + `}`,
		`{"model":"m-b","stream":false,"cache_salt":"s",` + msgs + `}`,
	} {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", b); st != http.StatusOK {
			t.Errorf("%s: %d %s", b, st, body)
		}
	}
}
