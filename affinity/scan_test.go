package affinity

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// scanCorpus: bodies the scanner must agree with fastjson on (and, for the
// first scanFast of them, handle itself).
var scanCorpus = []string{
	// handled by the scanner
	`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`,
	` { "messages" : [ { "role" : "user" , "content" : "a\nb" } ] , "model" : "m" } `,
	`{"model":"m","messages":[{"content":"late role","role":"user","name":"n"}]}`,
	`{"model":"m","messages":[{"role":"user","name":"bob","content":"hi","tool_call_id":"c1"}]}`,
	`{"model":"m","messages":[{"role":"tool","content":"r","tool_call_id":"c1"},{"role":"assistant","content":null}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},"b",{"text":"c","type":"input_text"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"\"q\" \\ \/ \b\f\n\r\t \u00e9 \u20ac \ud83d\ude00 \ud800 x \ud800\u0041 \udc00"}]}`,
	`{"model":"m","cache_salt":"s","user":"u","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","stream":false,"stream_options":{"include_usage":false,"x":[1,{"y":null}]},"max_completion_tokens":7,"max_tokens":3,"messages":[{"role":"developer","content":"d"},{"role":"user","content":"x"}]}`,
	`{"model":"m","stream":null,"max_tokens":1.5,"user":null,"cache_salt":3,"tools":[],"messages":[{"role":"user","content":[]}]}`,
	`{"model":"m","max_tokens":-3,"max_completion_tokens":1e3,"temperature":0.7,"n":1,"stop":["a","b"],"logit_bias":{"1":-100},"messages":[{"role":"user","content":"x","extra":{"a":[true,false,null,-0.5e-3]}}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":"none","tool_calls":{},"prompt":"ignored"}`,
	`{"model":"m","messages":[{"role":"assistant","content":"a","tool_calls":null},{"role":"user","content":"é ü 日本"}]}`,
	// left to fastjson (or refused)
	`{"model":"m","messages":[{"role":"user","content":"x","role":"system","content":"y","name":"z"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"u"},{"role":"system","content":"late system"}]}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":{"nested":[1,{"a":null}]}}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x","name":"after"}]}`,
	`{"model":"m","messages":[{"role":"us\u0065r","content":"x"}]}`,
	`{"model":"m\n","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"a","Stream":true,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"a","stream":"true","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"a","stream_options":{"include_usage":true,"Include_usage":false},"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"bad \x escape"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}]}x`,
	`{"model":"m","messages":[{"role":"user","content":"x"},]}`,
	`{"model":"m","max_tokens":01,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","max_tokens":NaN,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","messages":[]}`, `{"model":"m"}`, `{}`, `[]`, `{`, `null`, ``,
	`{"model":"m","messages":[{"role":"","content":"x"}]}`,
	`{"model":"m","messages":[{"content":"x"}]}`,
	`{"model":"m","messages":["x"]}`,
}

const scanFast = 13

// sameParse compares a scanner result with fastjson's.
func sameParse(t testing.TB, body []byte, a, b *Prompt) {
	t.Helper()
	if !bytes.Equal(a.Model, b.Model) || a.Stream != b.Stream || a.IncludeUsage != b.IncludeUsage ||
		!bytes.Equal(a.User, b.User) || !bytes.Equal(a.CacheSalt, b.CacheSalt) || a.MaxTokens != b.MaxTokens ||
		a.Tokens != b.Tokens || !bytes.Equal(a.Canonical, b.Canonical) || !slices.Equal(a.Hashes, b.Hashes) {
		t.Fatalf("scanner and fastjson differ on %q:\nscan %+v\njson %+v", body, *a, *b)
	}
}

// checkScan runs both paths on body; it reports whether the scanner took it.
func checkScan(t testing.TB, cfg HashConfig, body []byte) bool {
	t.Helper()
	p, q := NewParser(cfg), NewParser(cfg)
	var a, b Prompt
	ok := p.scanChat(body, &a)
	err := q.parseChatJSON(slices.Clone(body), &b)
	if !ok {
		return false
	}
	if err != nil {
		t.Fatalf("scanner accepted %q, fastjson refuses it: %v", body, err)
	}
	sameParse(t, body, &a, &b)
	return true
}

// TestScanChatMatchesJSON: on the corpus and on random chat bodies (random
// key order, whitespace, escapes, parts, extra fields, the cap cutting the
// canonical bytes), every body the scanner accepts gives fastjson's prompt
// exactly: model, flags, user, salt, max tokens, canonical bytes, hashes,
// token estimate. Typical bodies take the scanner.
func TestScanChatMatchesJSON(t *testing.T) {
	cfgs := []HashConfig{{}, {BlockTokens: 4, MaxPromptBytes: 300}}
	for i, body := range scanCorpus {
		for _, cfg := range cfgs {
			if took := checkScan(t, cfg, []byte(body)); took != (i < scanFast) {
				t.Errorf("corpus %d %q: scanner took it %v, want %v", i, body, took, i < scanFast)
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	took := 0
	const n = 3000
	for range n {
		body := randomChatBody(rng)
		for _, cfg := range cfgs {
			if checkScan(t, cfg, body) {
				took++
			}
		}
	}
	if took < n/2 {
		t.Errorf("scanner took %d of %d random bodies", took, 2*n)
	}
	// ParseChat itself: the scanner's result, and fastjson's errors.
	p := NewParser(HashConfig{})
	var a Prompt
	if err := p.ParseChat([]byte(`{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}`), &a); err != errDupField[0] {
		t.Fatalf("duplicate model: %v", err)
	}
	if err := p.ParseChat([]byte(scanCorpus[0]), &a); err != nil || string(a.Canonical) != "\x1esystem\x1fs\x1euser\x1fu" {
		t.Fatalf("%v %q", err, a.Canonical)
	}
}

// randomChatBody builds a chat body from random pieces, mostly valid.
func randomChatBody(rng *rand.Rand) []byte {
	ws := func() string { return []string{"", "", " ", "\n\t", " \r\n "}[rng.IntN(5)] }
	str := func() string {
		pieces := []string{"a", "hello world ", `\n`, `\"`, `\\`, `\/`, `\t`, `\u00e9`, `\u20AC`, `\ud83d\ude00`,
			`\ud800`, `\udc00x`, `\ud800\u0041`, "日本", "\x01", strings.Repeat("long text ", 40)}
		var b strings.Builder
		b.WriteByte('"')
		for range rng.IntN(8) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		if rng.IntN(60) == 0 {
			b.WriteString(`\q`)
		}
		b.WriteByte('"')
		return b.String()
	}
	obj := func(fields []string) string {
		rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
		var b strings.Builder
		b.WriteString("{" + ws())
		for i, f := range fields {
			if i > 0 {
				b.WriteString(ws() + "," + ws())
			}
			b.WriteString(f)
		}
		b.WriteString(ws() + "}")
		return b.String()
	}
	plain := func() string { return []string{`"a"`, `"bob"`, `"call_1"`, `""`, `"tenant-7"`}[rng.IntN(5)] }
	kv := func(k, v string) string { return `"` + k + `"` + ws() + ":" + ws() + v }
	content := func() string {
		switch rng.IntN(6) {
		case 0:
			return "null"
		case 1, 2:
			var parts []string
			for range rng.IntN(4) {
				switch rng.IntN(10) {
				case 0:
					parts = append(parts, str())
				case 1:
					parts = append(parts, obj([]string{kv("type", `"image_url"`), kv("image_url", obj([]string{kv("url", str())}))}))
				default:
					typ := []string{`"text"`, `"input_text"`}[rng.IntN(2)]
					parts = append(parts, obj([]string{kv("type", typ), kv("text", str())}))
				}
			}
			return "[" + strings.Join(parts, ",") + "]"
		}
		return str()
	}
	var msgs []string
	roles := []string{`"system"`, `"developer"`, `"user"`, `"assistant"`, `"tool"`}
	for i := range 1 + rng.IntN(5) {
		r := roles[rng.IntN(len(roles))]
		if i == 0 && rng.IntN(2) == 0 {
			r = `"system"`
		} else if i > 0 && rng.IntN(4) != 0 {
			r = roles[2+rng.IntN(3)]
		}
		f := []string{kv("role", r), kv("content", content())}
		if rng.IntN(5) == 0 {
			f = append(f, kv("name", plain()))
		}
		if rng.IntN(5) == 0 {
			f = append(f, kv("tool_call_id", plain()))
		}
		if rng.IntN(8) == 0 {
			f = append(f, kv("extra", `[1,{"k":[true,null,-2.5E+3]}]`))
		}
		if rng.IntN(10) == 0 {
			f = append(f, kv("content", str()))
		}
		msgs = append(msgs, obj(f))
	}
	top := []string{kv("model", []string{`"m"`, `"llama-3"`, str()}[rng.IntN(3)]), kv("messages", "["+ws()+strings.Join(msgs, ","+ws())+ws()+"]")}
	opt := []string{
		kv("stream", []string{"true", "false", "null"}[rng.IntN(3)]),
		kv("stream_options", obj([]string{kv("include_usage", []string{"true", "false", "1"}[rng.IntN(3)])})),
		kv("user", plain()), kv("cache_salt", []string{plain(), str()}[rng.IntN(2)]),
		kv("max_tokens", []string{"5", "0", "-1", "2.5", "1e2", `"7"`, "null", "123456789012"}[rng.IntN(8)]),
		kv("max_completion_tokens", fmt.Sprint(rng.IntN(100))),
		kv("temperature", "0.25"), kv("tools", []string{"[]", `[{"type":"function"}]`, "null"}[rng.IntN(3)]),
	}
	for _, o := range opt {
		if rng.IntN(3) == 0 {
			top = append(top, o)
		}
	}
	return []byte(ws() + obj(top) + ws())
}

// FuzzScanChat: on any body the scanner accepts, fastjson accepts it too and
// gives the same prompt; under a cap the body exceeds, strings take the
// generic path instead of the copy kernel.
func FuzzScanChat(f *testing.F) {
	for _, s := range scanCorpus {
		f.Add([]byte(s))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		f.Add(randomChatBody(rng))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkScan(t, HashConfig{BlockTokens: 4, MaxPromptBytes: 4096}, body)
		checkScan(t, HashConfig{}, body)
		checkScan(t, HashConfig{BlockTokens: 4, MaxPromptBytes: 64}, body) // the cap cuts: generic string path
	})
}

// unescapePlainRef is unescapePlain byte by byte.
func unescapePlainRef(src []byte) (int, []byte) {
	simple := map[byte]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}
	var out []byte
	for i := 0; i < len(src); {
		switch c := src[i]; c {
		case '"':
			return i, out
		case '\\':
			if i+1 == len(src) {
				return i, out
			}
			d, ok := simple[src[i+1]]
			if !ok {
				return i, out
			}
			out = append(out, d)
			i += 2
		default:
			out = append(out, c)
			i++
		}
	}
	return len(src), out
}

// TestUnescapePlain: the kernel decodes two-byte escapes and stops where the
// byte-by-byte reference stops, on random mixes of plain bytes, quotes,
// backslashes and escape letters at every length to 300, and writes
// nothing past dst[len(src)-1].
func TestUnescapePlain(t *testing.T) {
	if !hasUnescapePlain {
		t.Skip("no unescapePlain kernel on this CPU (the scanner uses bytes.IndexByte)")
	}
	withUnescapeKernels(func(path string) { testUnescapePlain(t, path) })
}

func testUnescapePlain(t *testing.T, path string) {
	rng := rand.New(rand.NewPCG(9, 10))
	alpha := []byte(`aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"ntu/bfrx\\`)
	dst := make([]byte, 400)
	for n := 0; n <= 300; n++ {
		for range 20 {
			src := make([]byte, n)
			sparse := rng.IntN(2) == 0
			for i := range src {
				src[i] = 'a' + byte(rng.IntN(26))
				if !sparse || rng.IntN(40) == 0 {
					src[i] = alpha[rng.IntN(len(alpha))]
				}
			}
			checkUnescapePlain(t, path, src, dst)
		}
	}
	// Escape-rich text: runs of plain bytes and valid two-byte escapes
	// with now and then what ends a whole-chunk decode (\u, \\, an
	// invalid escape, a quote), at every alignment.
	escs := []string{`\"`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`}
	odd := []string{`\u0041`, `\\`, `\x`, `"`, `\`}
	for n := 0; n <= 300; n++ {
		for range 20 {
			src := make([]byte, 0, n+8)
			rate := 1 + rng.IntN(6) // an escape in rate+1 tokens
			for len(src) < n {
				switch r := rng.IntN(100 * (rate + 1)); {
				case r < 3:
					src = append(src, odd[rng.IntN(len(odd))]...)
				case r < 100:
					src = append(src, escs[rng.IntN(len(escs))]...)
				default:
					src = append(src, 'a'+byte(rng.IntN(26)))
				}
			}
			checkUnescapePlain(t, path, src[:n], dst)
		}
	}
}

func checkUnescapePlain(t *testing.T, path string, src, dst []byte) {
	t.Helper()
	for i := range dst {
		dst[i] = 0xEE
	}
	c, w := unescapePlain(dst, src)
	rc, rout := unescapePlainRef(src)
	if c != rc || w != len(rout) || !bytes.Equal(dst[:w], rout) {
		t.Fatalf("%s: %q: consumed %d wrote %q, want %d %q", path, src, c, dst[:w], rc, rout)
	}
	for i := len(src); i < len(dst); i++ {
		if dst[i] != 0xEE {
			t.Fatalf("%s: %q: wrote dst[%d]", path, src, i)
		}
	}
}
