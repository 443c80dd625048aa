package affinity

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func parseResponses(t *testing.T, body string) (Prompt, []byte) {
	t.Helper()
	p := NewParser(HashConfig{})
	var pr Prompt
	prev, err := p.ParseResponses([]byte(body), &pr)
	if err != nil {
		t.Fatalf("ParseResponses(%s): %v", body, err)
	}
	pr.Canonical = append([]byte(nil), pr.Canonical...)
	pr.Hashes = append([]uint64(nil), pr.Hashes...)
	return pr, append([]byte(nil), prev...)
}

func TestParseResponsesCanonical(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"string input", `{"model":"m","input":"hi"}`, "\x1euser\x1fhi"},
		{"instructions first", `{"model":"m","instructions":"be terse","input":"hi"}`, "\x1esystem\x1fbe terse\x1euser\x1fhi"},
		{"items, system hoisted before tools",
			`{"model":"m","tools":[{"type":"function","name":"f"}],"input":[{"role":"user","content":"q"},{"role":"developer","content":[{"type":"input_text","text":"d"}]}]}`,
			"\x1edeveloper\x1fd\x1etools\x1f{\"type\":\"function\",\"name\":\"f\"}\x1euser\x1fq"},
		{"assistant output_text and a function call",
			`{"model":"m","input":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
			"\x1eassistant\x1fa\x1efunction_call_output\x1f{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}"},
		{"image part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://i"}]}]}`, "\x1euser\x1fhttp://i"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pr, _ := parseResponses(t, tc.body)
			if string(pr.Canonical) != tc.want {
				t.Fatalf("canonical %q, want %q", pr.Canonical, tc.want)
			}
			if string(pr.Model) != "m" {
				t.Fatalf("model %q", pr.Model)
			}
		})
	}
}

// A Responses request whose instructions are a chat request's system
// message shares that prefix's blocks with it (vLLM renders both through the
// chat template the same way).
func TestParseResponsesSharesChatPrefix(t *testing.T) {
	_, chatHashes, _ := parseChat(t, string(chatBody("m", longSystem, "hello")))
	pr, _ := parseResponses(t, fmt.Sprintf(`{"model":"m","instructions":%q,"input":"something else"}`, longSystem))
	if n := sharedBlocks(chatHashes, pr.Hashes); n < len(longSystem)/256 {
		t.Fatalf("shared %d blocks with the chat request, want >= %d", n, len(longSystem)/256)
	}
	other, _ := parseResponses(t, fmt.Sprintf(`{"model":"m","instructions":%q,"input":"x"}`, "Z"+longSystem))
	if n := sharedBlocks(other.Hashes, pr.Hashes); n != 0 {
		t.Fatalf("different instructions share %d blocks", n)
	}
}

func TestParseResponsesFields(t *testing.T) {
	pr, prev := parseResponses(t, `{"model":"m","input":"hi","stream":true,"user":"u","max_output_tokens":7,"previous_response_id":"resp_1","cache_salt":"s"}`)
	if !pr.Stream || string(pr.User) != "u" || pr.MaxTokens != 7 || string(prev) != "resp_1" || string(pr.CacheSalt) != "s" {
		t.Fatalf("got %+v prev %q", pr, prev)
	}
	if pr.Tokens < 1 || len(pr.Hashes) != 0 { // one short message: no full block
		t.Fatalf("tokens %d hashes %d", pr.Tokens, len(pr.Hashes))
	}
	_, prev = parseResponses(t, `{"model":"m","input":"hi","previous_response_id":null}`)
	if prev != nil {
		t.Fatalf("null previous_response_id gave %q", prev)
	}
}

func TestParseResponsesErrors(t *testing.T) {
	tests := []struct{ name, body, field string }{
		{"no input", `{"model":"m"}`, "input"},
		{"input number", `{"model":"m","input":3}`, "input"},
		{"item not object", `{"model":"m","input":["x"]}`, "input[]"},
		{"item without role or type", `{"model":"m","input":[{"content":"x"}]}`, "input[]"},
		{"instructions not string", `{"model":"m","input":"x","instructions":1}`, "instructions"},
		{"prev empty", `{"model":"m","input":"x","previous_response_id":""}`, "previous_response_id"},
		{"prev number", `{"model":"m","input":"x","previous_response_id":1}`, "previous_response_id"},
		{"prev twice", `{"model":"m","input":"x","previous_response_id":"a","previous_response_id":"b"}`, "previous_response_id"},
		{"instructions other case", `{"model":"m","input":"x","Instructions":"a"}`, "instructions"},
		{"no model", `{"input":"x"}`, "model"},
		{"not an object", `[1]`, "body"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var pr Prompt
			_, err := NewParser(HashConfig{}).ParseResponses([]byte(tc.body), &pr)
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err %v, want ErrBadRequest", err)
			}
			if !strings.HasPrefix(err.Error(), ErrBadRequest.Error()+": "+tc.field) {
				t.Fatalf("err %q does not name %s first", err, tc.field)
			}
		})
	}
}

// FuzzParseResponses: no panic, canonical bytes bounded by the cap and the
// body size, hashes consistent with them, deterministic.
func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi"}`,
		`{"model":"m","instructions":"be terse","tools":[{"type":"function","name":"f"}],"input":[{"role":"developer","content":[{"type":"input_text","text":"d"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"},{"role":"assistant","content":[{"type":"output_text","text":"a"}]},{"role":"user","content":[{"type":"input_image","image_url":"u"},{"type":"input_file","file_id":"f"}]}]}`,
		`{"model":"m","input":"x","previous_response_id":"resp_1","max_output_tokens":3,"stream":true}`,
		`{"model":"m","input":[1]}`, `{"model":"m","input":"x","previous_response_id":""}`, `{"model":"m","instructions":null,"input":[]}`,
		`{"model":"m","input":"x","Previous_response_id":"a"}`, `[]`, `{`,
	} {
		f.Add([]byte(s))
	}
	const capBytes = 4096
	cfg := HashConfig{BlockTokens: 4, MaxPromptBytes: capBytes}
	f.Fuzz(func(t *testing.T, body []byte) {
		var a, b Prompt
		prevA, errA := NewParser(cfg).ParseResponses(body, &a)
		prevB, errB := NewParser(cfg).ParseResponses(append([]byte(nil), body...), &b)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("nondeterministic error: %v vs %v", errA, errB)
		}
		if errA != nil {
			if !errors.Is(errA, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", errA)
			}
			return
		}
		if len(a.Canonical) > capBytes || len(a.Canonical) > 6*len(body)+64 {
			t.Fatalf("canonical %d bytes from a %d-byte body", len(a.Canonical), len(body))
		}
		if len(a.Hashes) != len(a.Canonical)/16 || a.Tokens < 0 || len(a.Model) == 0 {
			t.Fatalf("hashes %d canonical %d tokens %d", len(a.Hashes), len(a.Canonical), a.Tokens)
		}
		if string(a.Canonical) != string(b.Canonical) || string(prevA) != string(prevB) || a.Tokens != b.Tokens {
			t.Fatal("nondeterministic")
		}
	})
}
