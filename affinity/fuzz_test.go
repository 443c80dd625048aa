package affinity

import (
	"slices"
	"testing"
)

// FuzzCanonicalize feeds arbitrary bodies to every parser entry point: no
// panic, canonical bytes bounded by the cap and by the body size, hashes
// consistent with the canonical bytes, and parsing deterministic.
func FuzzCanonicalize(f *testing.F) {
	seeds := []string{
		string(chatBody("m", "system", "user", "assistant", "user again")),
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"type":"input_audio","input_audio":{"data":"AAA"}}]}]}`,
		`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"messages":[{"role":"developer","content":"d"},{"role":"assistant","tool_calls":[{"id":"1"}]},{"role":"tool","tool_call_id":"1","content":"r"}]}`,
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","prompt":["a","b"]}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","input":["x",[1,2]]}`,
		`{"model":"m","cache_salt":"s","user":"u","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"\u00e9\n"}]}`,
		`{"model":"","messages":[]}`,
		`[]`, `{`, `null`, `{"model":"m","messages":[{"role":"user","content":{"nested":[1,{"a":null}]}}]}`,
		// ambiguous routing fields (refused): duplicates, other letter cases, lax booleans
		`{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"a","Stream":true,"ſtream":true,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"a","stream":"true","cache_salt":"s","cache_salt":null,"prompt":"p"}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	const capBytes = 4096
	cfg := HashConfig{BlockTokens: 4, MaxPromptBytes: capBytes} // 16-byte blocks: many hashes
	parsers := []func(*Parser, []byte, *Prompt) error{(*Parser).ParseChat, (*Parser).ParseCompletion, (*Parser).ParseEmbedding}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, q := NewParser(cfg), NewParser(cfg) // fresh: scratch size reflects this body only
		for _, parse := range parsers {
			var a, b Prompt
			errA := parse(p, body, &a)
			errB := parse(q, slices.Clone(body), &b)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("nondeterministic error: %v vs %v", errA, errB)
			}
			if errA != nil {
				continue
			}
			if len(a.Canonical) > capBytes || len(a.Canonical) > 6*len(body)+64 {
				t.Fatalf("canonical %d bytes from a %d-byte body", len(a.Canonical), len(body))
			}
			if c := cap(p.canon); c > 2*(capBytes+6*len(body)+64) {
				t.Fatalf("scratch grew to %d bytes for a %d-byte body", c, len(body))
			}
			if len(a.Hashes) != len(a.Canonical)/16 || a.Tokens < 0 || len(a.Model) == 0 {
				t.Fatalf("hashes %d canonical %d tokens %d", len(a.Hashes), len(a.Canonical), a.Tokens)
			}
			if !slices.Equal(a.Canonical, b.Canonical) || !slices.Equal(a.Hashes, b.Hashes) || a.Tokens != b.Tokens {
				t.Fatal("nondeterministic canonicalization")
			}
		}
	})
}
