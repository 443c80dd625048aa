package slowpath

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/affinity"
)

func TestBadInputs(t *testing.T) {
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.Limits.MaxBodyBytes = 4096
	e.Gate = make(chan struct{})
	s, url := newTestServer(t, cfg)
	// Another client's stream is open the whole time and must be untouched.
	stream, err := testClient.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	sbr := bufio.NewReader(stream.Body)
	readEvent(t, sbr)
	tests := []struct {
		name, method, path, ct, body string
		status                       int
		want                         string
	}{
		{"unknown path", "POST", "/v1/nope", "application/json", chatBody, 404,
			`{"error":{"message":"Invalid URL (POST /v1/nope)","type":"invalid_request_error","param":null,"code":"unknown_url"}}`},
		{"root path", "GET", "/", "", "", 404,
			`{"error":{"message":"Invalid URL (GET /)","type":"invalid_request_error","param":null,"code":"unknown_url"}}`},
		{"GET on chat", "GET", "/v1/chat/completions", "", "", 405,
			`{"error":{"message":"Method GET not allowed for /v1/chat/completions; use POST","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`},
		{"POST on models", "POST", "/v1/models", "application/json", "{}", 405,
			`{"error":{"message":"Method POST not allowed for /v1/models; use GET","type":"invalid_request_error","param":null,"code":"method_not_allowed"}}`},
		{"wrong content type", "POST", "/v1/chat/completions", "text/plain", chatBody, 400,
			`{"error":{"message":"Content-Type must be application/json (or application/*+json), got text/plain","type":"invalid_request_error","param":null,"code":null}}`},
		{"form content type", "POST", "/v1/completions", "application/x-www-form-urlencoded", "model=m", 400,
			`{"error":{"message":"Content-Type must be application/json (or application/*+json), got application/x-www-form-urlencoded","type":"invalid_request_error","param":null,"code":null}}`},
		{"empty body", "POST", "/v1/chat/completions", "application/json", "", 400,
			`{"error":{"message":"We could not parse the JSON body of your request: the body is empty.","type":"invalid_request_error","param":null,"code":null}}`},
		{"malformed json", "POST", "/v1/chat/completions", "application/json", `{"model":"m","messages":[`, 400,
			`{"error":{"message":"We could not parse the JSON body of your request: the body is truncated: it ends at byte 25 (line 1, column 26) inside an unfinished value.","type":"invalid_request_error","param":null,"code":null}}`},
		{"json array", "POST", "/v1/chat/completions", "application/json", `[1,2]`, 400,
			`{"error":{"message":"We could not parse the JSON body of your request: the body is a JSON array, not an object.","type":"invalid_request_error","param":null,"code":null}}`},
		{"missing model", "POST", "/v1/chat/completions", "application/json", `{"messages":[{"role":"user","content":"x"}]}`, 400,
			`{"error":{"message":"Invalid request: model must be a non-empty string","type":"invalid_request_error","param":"model","code":null}}`},
		{"model not a string", "POST", "/v1/chat/completions", "application/json", `{"model":7,"messages":[{"role":"user","content":"x"}]}`, 400,
			`{"error":{"message":"Invalid request: model must be a non-empty string","type":"invalid_request_error","param":"model","code":null}}`},
		{"missing messages", "POST", "/v1/chat/completions", "application/json", `{"model":"m"}`, 400,
			`{"error":{"message":"Invalid request: messages must be a non-empty array","type":"invalid_request_error","param":"messages","code":null}}`},
		{"message without role", "POST", "/v1/chat/completions", "application/json", `{"model":"m","messages":[{"content":"x"}]}`, 400,
			`{"error":{"message":"Invalid request: messages[] must be objects with a string role","type":"invalid_request_error","param":"messages","code":null}}`},
		{"bad prompt", "POST", "/v1/completions", "application/json", `{"model":"m","prompt":{"a":1}}`, 400,
			`{"error":{"message":"Invalid request: prompt must be a string or an array of strings or token ids","type":"invalid_request_error","param":"prompt","code":null}}`},
		{"embeddings without input", "POST", "/v1/embeddings", "application/json", `{"model":"m"}`, 400,
			`{"error":{"message":"Invalid request: input is required","type":"invalid_request_error","param":"input","code":null}}`},
		{"unknown model", "POST", "/v1/chat/completions", "application/json", strings.Replace(chatBody, `"m"`, `"gpt-9"`, 1), 404,
			"{\"error\":{\"message\":\"The model `gpt-9` does not exist or you do not have access to it.\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}"},
		{"headers too large", "POST", "/v1/chat/completions", "application/json", chatBody, 431,
			`{"error":{"message":"Request line and headers exceed 16384 bytes.","type":"invalid_request_error","param":null,"code":"headers_too_large"}}`},
		{"body too large", "POST", "/v1/chat/completions", "application/json", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, 413,
			`{"error":{"message":"Request body exceeds the limit of 4096 bytes.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, url+tc.path, strings.NewReader(tc.body))
			if tc.name == "headers too large" {
				req.Header.Set("X-Big", strings.Repeat("b", 20000))
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.ct != "" {
				req.Header.Set("Content-Type", tc.ct)
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || string(b) != tc.want {
				t.Fatalf("got %d %s\nwant %d %s", resp.StatusCode, b, tc.status, tc.want)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	if n := e.requests.Load(); n != 1 {
		t.Errorf("engine saw %d requests, want only the stream; bad input must stop at the router", n)
	}
	e.open()
	n := 1
	for readEvent(t, sbr) != "[DONE]" {
		n++
	}
	if n != 4 {
		t.Fatalf("the concurrent stream had %d events, want 4", n)
	}
	// The router still works after all that.
	if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
		t.Fatalf("after bad inputs: %d %s", st, body)
	}
	_ = s
}

// TestBadRequestMessage: a parse error's client message and param come
// from its *affinity.FieldError; other errors are the body's, without one.
func TestBadRequestMessage(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		msg, param string
	}{
		{"field", &affinity.FieldError{Field: "messages", Msg: "messages[] must be objects with a string role"},
			"Invalid request: messages[] must be objects with a string role", "messages"},
		{"wrapped field", fmt.Errorf("chat: %w", &affinity.FieldError{Field: "model", Msg: "model must be a non-empty string"}),
			"Invalid request: model must be a non-empty string", "model"},
		{"whole body", &affinity.FieldError{Msg: "body is not a JSON object"},
			"We could not parse the JSON body of your request: body is not a JSON object", ""},
		{"other error", errors.New("unexpected end"), "We could not parse the JSON body of your request: unexpected end", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if msg, param := badRequest(tt.err); msg != tt.msg || param != tt.param {
				t.Fatalf("badRequest = %q, %q; want %q, %q", msg, param, tt.msg, tt.param)
			}
		})
	}
}
