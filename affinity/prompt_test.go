package affinity

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

var longSystem = strings.Repeat("You are a helpful assistant that answers precisely. ", 40) // ~2 KiB

// sharedBlocks counts leading equal hashes.
func sharedBlocks(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func parseChat(t *testing.T, body string) (canon []byte, hashes []uint64, pr Prompt) {
	t.Helper()
	p := NewParser(HashConfig{})
	if err := p.ParseChat([]byte(body), &pr); err != nil {
		t.Fatalf("ParseChat(%s): %v", body, err)
	}
	return append([]byte(nil), pr.Canonical...), append([]uint64(nil), pr.Hashes...), pr
}

func TestCanonicalSharing(t *testing.T) {
	sys := longSystem
	tests := []struct {
		name      string
		a, b      string
		minShared int // at least this many leading blocks equal
		maxShared int // at most (-1: no bound)
	}{
		{
			name:      "same prefix, different last turn",
			a:         string(chatBody("m", sys, "What is 2+2?", "4", "And 3+3?")),
			b:         string(chatBody("m", sys, "What is 2+2?", "4", "Tell me about Rome.")),
			minShared: len(sys) / 256,
			maxShared: -1,
		},
		{
			name:      "different system prompt",
			a:         string(chatBody("m", sys, "hello")),
			b:         string(chatBody("m", "X"+sys, "hello")),
			maxShared: 0,
		},
		{
			name:      "different model",
			a:         string(chatBody("m1", sys, "hello")),
			b:         string(chatBody("m2", sys, "hello")),
			maxShared: 0,
		},
		{
			name:      "different cache salt",
			a:         `{"model":"m","cache_salt":"a","messages":[{"role":"system","content":"` + sys + `"}]}`,
			b:         `{"model":"m","cache_salt":"b","messages":[{"role":"system","content":"` + sys + `"}]}`,
			maxShared: 0,
		},
		{
			name:      "string content equals text parts",
			a:         `{"model":"m","messages":[{"role":"system","content":"` + sys + `"}]}`,
			b:         `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"` + sys[:100] + `"},{"type":"text","text":"` + sys[100:] + `"}]}]}`,
			minShared: len(sys) / 256,
			maxShared: -1,
		},
		{
			name:      "system moved first",
			a:         `{"model":"m","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hi"}]}`,
			b:         `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"system","content":"` + sys + `"}]}`,
			minShared: len(sys) / 256,
			maxShared: -1,
		},
		{
			name:      "different tools",
			a:         `{"model":"m","tools":[{"type":"function","function":{"name":"a"}}],"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"` + sys + `"}]}`,
			b:         `{"model":"m","tools":[{"type":"function","function":{"name":"b"}}],"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"` + sys + `"}]}`,
			minShared: len(sys)/256 - 1,
			maxShared: len(sys)/256 + 1,
		},
		{
			name:      "whitespace in JSON does not matter",
			a:         `{"model":"m","messages":[{"role":"system","content":"` + sys + `"}]}`,
			b:         "{ \"model\" : \"m\" ,\n \"messages\" : [ { \"content\" : \"" + sys + "\", \"role\" : \"system\" } ] }",
			minShared: len(sys) / 256,
			maxShared: -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ha, _ := parseChat(t, tt.a)
			_, hb, _ := parseChat(t, tt.b)
			n := sharedBlocks(ha, hb)
			if n < tt.minShared || (tt.maxShared >= 0 && n > tt.maxShared) {
				t.Fatalf("shared %d blocks (of %d/%d), want [%d, %d]", n, len(ha), len(hb), tt.minShared, tt.maxShared)
			}
		})
	}
}

func TestParseChatFields(t *testing.T) {
	body := `{"model":"llama","stream":true,"stream_options":{"include_usage":true},"user":"u1",
	"max_completion_tokens":77,"cache_salt":"s",
	"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
	"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"http://x/i.png"}}]},
	{"role":"system","content":"sys"},
	{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
	{"role":"tool","tool_call_id":"c1","content":"ok"}]}`
	canon, _, pr := parseChat(t, body)
	want := "\x1esystem\x1fsys" +
		"\x1etools\x1f" + `{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}` +
		"\x1euser\x1flookhttp://x/i.png" +
		"\x1eassistant\x1f\x1c" + `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]` +
		"\x1etool\x1fok\x1dc1"
	if string(canon) != want {
		t.Fatalf("canonical\n got %q\nwant %q", canon, want)
	}
	if string(pr.Model) != "llama" || !pr.Stream || !pr.IncludeUsage || string(pr.User) != "u1" ||
		pr.MaxTokens != 77 || string(pr.CacheSalt) != "s" {
		t.Fatalf("fields %+v", pr)
	}
	if pr.Tokens != (len(want)+3)/4 {
		t.Fatalf("tokens %d, want %d", pr.Tokens, (len(want)+3)/4)
	}
}

func TestParseCompletion(t *testing.T) {
	ids := func(xs ...uint32) string {
		var b []byte
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, x)
		}
		return string(b)
	}
	tests := []struct {
		name   string
		body   string
		canon  string
		tokens int
		err    error
	}{
		{name: "string", body: `{"model":"m","prompt":"hello world!"}`, canon: "hello world!", tokens: 3},
		{name: "strings batch", body: `{"model":"m","prompt":["ab","cd"]}`, canon: "ab\x1ecd", tokens: 2},
		{name: "token ids", body: `{"model":"m","prompt":[1,2,300]}`, canon: ids(1, 2, 300), tokens: 3},
		{name: "token id batch", body: `{"model":"m","prompt":[[1,2],[3]]}`, canon: ids(1, 2) + "\x1e" + ids(3), tokens: 4},
		{name: "no prompt", body: `{"model":"m"}`, err: ErrBadRequest},
		{name: "bad prompt", body: `{"model":"m","prompt":{"a":1}}`, err: ErrBadRequest},
		{name: "negative id", body: `{"model":"m","prompt":[-1]}`, err: ErrBadRequest},
		{name: "no model", body: `{"prompt":"x"}`, err: ErrBadRequest},
		{name: "not json", body: `{"model":`, err: ErrBadRequest},
		{name: "not object", body: `[1]`, err: ErrBadRequest},
	}
	p := NewParser(HashConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pr Prompt
			err := p.ParseCompletion([]byte(tt.body), &pr)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(pr.Canonical) != tt.canon || pr.Tokens != tt.tokens {
				t.Fatalf("canon %q tokens %d, want %q %d", pr.Canonical, pr.Tokens, tt.canon, tt.tokens)
			}
		})
	}
}

func TestParseChatErrors(t *testing.T) {
	tests := []struct{ name, body, field string }{
		{"no messages", `{"model":"m"}`, "messages"},
		{"empty messages", `{"model":"m","messages":[]}`, "messages"},
		{"message not object", `{"model":"m","messages":[1]}`, "messages[]"},
		{"no role", `{"model":"m","messages":[{"content":"x"}]}`, "messages[]"},
		{"model not string", `{"model":1,"messages":[{"role":"user","content":"x"}]}`, "model"},
	}
	p := NewParser(HashConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pr Prompt
			err := p.ParseChat([]byte(tt.body), &pr)
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("err %v, want ErrBadRequest naming %s", err, tt.field)
			}
		})
	}
}

func TestParseEmbedding(t *testing.T) {
	p := NewParser(HashConfig{})
	var pr Prompt
	if err := p.ParseEmbedding([]byte(`{"model":"e","input":["abcd","efgh"],"user":"x"}`), &pr); err != nil {
		t.Fatal(err)
	}
	if string(pr.Model) != "e" || pr.Tokens != 2 || len(pr.Hashes) != 0 || string(pr.User) != "x" {
		t.Fatalf("%+v", pr)
	}
	if err := p.ParseEmbedding([]byte(`{"model":"e"}`), &pr); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("missing input: %v", err)
	}
}

func TestMaxPromptBytes(t *testing.T) {
	p := NewParser(HashConfig{MaxPromptBytes: 1024})
	var pr Prompt
	body := `{"model":"m","prompt":"` + strings.Repeat("a", 5000) + `"}`
	if err := p.ParseCompletion([]byte(body), &pr); err != nil {
		t.Fatal(err)
	}
	if len(pr.Canonical) != 1024 || len(pr.Hashes) != 4 || pr.Tokens != 1250 {
		t.Fatalf("canon %d hashes %d tokens %d", len(pr.Canonical), len(pr.Hashes), pr.Tokens)
	}
}

func TestHashChain(t *testing.T) {
	data := []byte(strings.Repeat("0123456789abcdef", 64)) // 1 KiB = 4 blocks
	seed := Seed([]byte("m"), nil)
	h := AppendHashes(nil, seed, data, 256)
	if len(h) != 4 {
		t.Fatalf("%d hashes", len(h))
	}
	// Equal blocks at different depths must hash differently (chaining).
	for i := 1; i < len(h); i++ {
		if h[i] == h[i-1] {
			t.Fatalf("block %d hash equals its parent", i)
		}
	}
	// A change in block 2 leaves blocks 0-1 and changes 2-3.
	d2 := append([]byte(nil), data...)
	d2[600] ^= 1
	h2 := AppendHashes(nil, seed, d2, 256)
	if sharedBlocks(h, h2) != 2 || h[3] == h2[3] {
		t.Fatalf("shared %d", sharedBlocks(h, h2))
	}
	if Seed([]byte("m"), nil) == Seed([]byte("m"), []byte("s")) || Seed([]byte("a"), nil) == Seed([]byte("b"), nil) {
		t.Fatal("seed ignores model or salt")
	}
	if partial := AppendHashes(nil, seed, data[:255], 256); len(partial) != 0 {
		t.Fatal("partial block hashed")
	}
	switch HashPath() {
	case "avx512-256", "avx2-256", "avx512", "avx2", "sse2", "neon", "generic":
	default:
		t.Fatalf("HashPath %q", HashPath())
	}
}

func TestPromptFill(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		buffered bool
		session  bool
	}{
		{"stream with user", `{"model":"m","stream":true,"user":"u","messages":[{"role":"user","content":"x"}]}`, false, true},
		{"buffered without user", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, true, false},
	}
	p := NewParser(HashConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				pr  Prompt
				req Request
			)
			if err := p.ParseChat([]byte(tt.body), &pr); err != nil {
				t.Fatal(err)
			}
			pr.Fill(&req, 42)
			if req.Buffered != tt.buffered || (req.SessionKey != 0) != tt.session || req.Now != 42 ||
				string(req.Model) != "m" || req.PromptTokens != pr.Tokens {
				t.Fatalf("request %+v", req)
			}
		})
	}
	if SessionKey(nil) != 0 || SessionKey([]byte("a")) == 0 || SessionKey([]byte("a")) == SessionKey([]byte("b")) {
		t.Fatal("SessionKey")
	}
}

// TestAmbiguousKeysAllocFree: the duplicate- and case-key checks (top
// level and stream_options) allocate nothing once the parser is warm.
func TestAmbiguousKeysAllocFree(t *testing.T) {
	p := NewParser(HashConfig{})
	body := []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"user":"u","Temperature":1,"messages":[{"role":"user","content":"hi"}]}`)
	var pr Prompt
	if err := p.ParseChat(body, &pr); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = p.ParseChat(body, &pr) }); n != 0 {
		t.Fatalf("%v allocs per parse, want 0", n)
	}
	dup := []byte(`{"model":"m","stream_options":{"include_usage":true,"Include_Usage":false},"messages":[{"role":"user","content":"hi"}]}`)
	if err := p.ParseChat(dup, &pr); err == nil || !strings.Contains(err.Error(), "stream_options.include_usage") {
		t.Fatalf("duplicate include_usage: %v", err)
	}
}
