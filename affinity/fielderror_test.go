package affinity

import (
	"errors"
	"testing"
)

// TestParseErrorsNameTheirField: every parse failure is a *FieldError
// wrapping ErrBadRequest whose Field is the request parameter at fault
// ("" for the body as a whole), as the proxy's 400 `param` reports it.
func TestParseErrorsNameTheirField(t *testing.T) {
	p := NewParser(HashConfig{})
	tests := []struct {
		name, api, body, field, msg string
	}{
		{"not an object", "chat", `[1]`, "", "body is not a JSON object"},
		{"no model", "chat", `{"messages":[{"role":"user","content":"x"}]}`, "model", "model must be a non-empty string"},
		{"no messages", "chat", `{"model":"m"}`, "messages", "messages must be a non-empty array"},
		{"bad message", "chat", `{"model":"m","messages":[1]}`, "messages", "messages[] must be objects with a string role"},
		{"bad stream", "chat", `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, "stream", "stream must be a boolean (true or false)"},
		{"duplicate model", "chat", `{"model":"m","Model":"n","messages":[{"role":"user","content":"x"}]}`, "model", ""},
		{"bad prompt", "completion", `{"model":"m","prompt":{"a":1}}`, "prompt", "prompt must be a string or an array of strings or token ids"},
		{"no input", "embedding", `{"model":"m"}`, "input", "input is required"},
		{"bad responses input", "responses", `{"model":"m","input":1}`, "input", "input must be a string or an array of input items"},
		{"bad instructions", "responses", `{"model":"m","input":"x","instructions":1}`, "instructions", "instructions must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pr Prompt
			var err error
			switch tt.api {
			case "chat":
				err = p.ParseChat([]byte(tt.body), &pr)
			case "completion":
				err = p.ParseCompletion([]byte(tt.body), &pr)
			case "embedding":
				err = p.ParseEmbedding([]byte(tt.body), &pr)
			case "responses":
				_, err = p.ParseResponses([]byte(tt.body), &pr)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err %v (%T), want a *FieldError wrapping ErrBadRequest", err, err)
			}
			if fe.Field != tt.field || (tt.msg != "" && fe.Msg != tt.msg) {
				t.Fatalf("FieldError{%q, %q}, want field %q msg %q", fe.Field, fe.Msg, tt.field, tt.msg)
			}
			if err.Error() != "bad request: "+fe.Msg {
				t.Fatalf("Error() %q, want %q", err.Error(), "bad request: "+fe.Msg)
			}
		})
	}
}
