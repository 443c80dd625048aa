package slowpath

import (
	"bytes"

	"github.com/valyala/fastjson"
	"github.com/warmpath/warmpath/affinity"
)

// Reading usage out of answers: the SSE line splitter over a relayed
// stream (scan, sseLine) and the JSON readers for cached tokens and
// llama.cpp timings that buffered bodies and stream events share.

// scan feeds streamed bytes through an SSE line splitter to find the usage
// chunk (stream_options.include_usage) and its cached_tokens. Once the
// first token was seen, a run of whole lines holding no usage key is
// passed over with one search, as looking at each of its events would
// find nothing: in a stream only the final events carry usage.
func (ex *exchange) scan(b []byte) {
	skipChecked := false
	for len(b) > 0 {
		if ex.output && ex.ep != epResponses && !skipChecked && len(ex.line) == 0 && !ex.lineDrop {
			skipChecked = true
			if end := bytes.LastIndexByte(b, '\n'); end >= 0 {
				// Whole lines before the first usage key need no look.
				k := usageKeyIndex(b[:end])
				if k < 0 {
					b = b[end+1:]
					continue
				}
				if ls := bytes.LastIndexByte(b[:k], '\n'); ls >= 0 {
					b = b[ls+1:]
					continue
				}
			}
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !ex.lineDrop {
				if len(ex.line)+len(b) > maxSSELine {
					ex.lineDrop = true
					ex.line = ex.line[:0]
				} else {
					ex.line = append(ex.line, b...)
				}
			}
			return
		}
		seg := b[:i]
		b = b[i+1:]
		if ex.lineDrop {
			ex.lineDrop = false
			continue
		}
		if len(ex.line) > 0 {
			ex.line = append(ex.line, seg...)
			ex.sseLine(ex.line)
			ex.line = ex.line[:0]
		} else {
			ex.sseLine(seg)
		}
	}
}

// usageKeyIndex is the index of the first key sseLine reads anything from
// (cached tokens, llama.cpp timings, and "completion_tokens"), or -1.
func usageKeyIndex(b []byte) int {
	i, _, _ := nextUsageKey(b, 0, keyCached|keyTimings|keyTokens)
	return i
}

// usageKeysIn reports which kinds of usage key b holds, 0 for none.
func usageKeysIn(b []byte) (kinds uint8) {
	for off := 0; ; {
		i, k, next := nextUsageKey(b, off, keyCached|keyTimings|keyTokens)
		if i < 0 {
			return kinds
		}
		kinds |= k
		off = next
	}
}

// nextUsageKey finds the first usage key of a kind in mask in b whose
// underscore is at or after off: its index and kind, and where to look for
// the next one; -1 when there is none.
func nextUsageKey(b []byte, off int, mask uint8) (at int, kind uint8, next int) {
	for off < len(b) {
		i := bytes.IndexByte(b[off:], '_')
		if i < 0 {
			break
		}
		i += off
		off = i + 1
		if i+1 < len(b) && b[i+1] != 't' && b[i+1] != 'n' && b[i+1] != 'm' {
			continue // "_tokens", "_n", "_ms" only: most underscores (finish_reason) end here
		}
		for _, k := range usageKeys {
			if j := i - k.at; k.kind&mask != 0 && j >= 0 && j+len(k.key) <= len(b) && string(b[j:j+len(k.key)]) == k.key {
				return j, k.kind, off
			}
		}
	}
	return -1, 0, len(b)
}

// Kinds of usage key: usage's cached tokens, and the members of llama.cpp's
// timings object that usageJSON reads.
const (
	keyCached  uint8 = 1 << iota // "cached_tokens"
	keyTimings                   // "cache_n", "prompt_n", "prompt_ms", "predicted_ms"
	keyTokens                    // "completion_tokens" (usageTokens)
)

// usageKeys are the keys nextUsageKey looks for, with the offset of their
// first underscore; the byte after it is 't', 'n' or 'm' (nextUsageKey
// passes over any other underscore at once).
var usageKeys = [...]struct {
	key  string
	at   int
	kind uint8
}{
	{`"cached_tokens"`, 7, keyCached}, {`"cache_n"`, 6, keyTimings}, {`"prompt_n"`, 7, keyTimings},
	{`"prompt_ms"`, 7, keyTimings}, {`"predicted_ms"`, 10, keyTimings}, {`"completion_tokens"`, 11, keyTokens},
}

func (ex *exchange) sseLine(line []byte) {
	if !bytes.HasPrefix(line, strDataPrefix) {
		return
	}
	data := bytes.TrimSpace(line[len(strDataPrefix):])
	if len(data) == 0 {
		return
	}
	if ex.ep == epResponses {
		ex.responsesEvent(data) // named events: their own first token and usage
		return
	}
	if !ex.output && !rolePreamble(data) {
		ex.output = true
	}
	kinds := usageKeysIn(data) // one scan for every key read below
	if kinds&keyTokens != 0 {
		ex.promptRep, ex.outTok = usageTokens(&ex.fjParser, data)
		ex.tenantCharge() // the tenant's charge is corrected at the end
	}
	if kinds&(keyCached|keyTimings) == 0 {
		return
	}
	if c := usageJSON(&ex.fjParser, data, &ex.timings); c >= 0 {
		ex.cached = c
	}
}

// rolePreamble reports whether an SSE event is a chat stream's role chunk
// without output (`"delta":{"role":"assistant","content":""}`): servers may
// send it before prefill (enginesim does; vLLM sends it with the first
// token), so the first token is the first event that is not one. Timed
// at the preamble, every prefill would look instantaneous (the live bench
// fits prefill rates of 1e8 tokens/s against 250,000 real), cache hits
// would be worth nothing to the cost policy, and it would spread every
// shared prefix over all replicas.
func rolePreamble(data []byte) bool {
	if !bytes.Contains(data, strRole) {
		return false
	}
	for rest := data; ; {
		i := bytes.Index(rest, strContent)
		if i < 0 {
			return true
		}
		rest = bytes.TrimLeft(rest[i+len(strContent):], " \t")
		if len(rest) > 0 && rest[0] == ':' {
			rest = bytes.TrimLeft(rest[1:], " \t")
			if len(rest) > 1 && rest[0] == '"' && rest[1] != '"' {
				return false // non-empty content
			}
		}
	}
}

// usageScanFrom: bodies longer than this are not parsed whole for their
// usage: only their last "usage" and "timings" objects are (engines put
// them last, after the generated text, which is most of any answer but a
// few words long). A whole parse of a 4 KiB answer costs a few µs, several
// percent of the proxy's work for it.
const usageScanFrom = 1 << 10

var strUsage = []byte(`"usage"`)

// usageJSON returns the cached prompt tokens an answer (or a stream's
// final event) reports: usage.prompt_tokens_details.cached_tokens, else
// llama.cpp's timings.cache_n; -1 when neither. It also fills o's engine
// timings from llama.cpp's `timings` object (prompt_n, prompt_ms,
// predicted_ms), leaving o alone when there is none.
func usageJSON(p *fastjson.Parser, body []byte, o *affinity.Outcome) int {
	keys := usageKeysIn(body) & (keyCached | keyTimings) // one byte search; substring searches cost ~10 µs on 32 KiB of text
	if keys == 0 {
		return -1
	}
	hasCached, hasTimings := keys&keyCached != 0, keys&keyTimings != 0
	if len(body) > usageScanFrom {
		cached := -1
		if hasCached {
			cached = cachedTokensTail(p, body)
		}
		if hasTimings {
			if obj := lastObject(body, strTimings); obj != nil {
				if t, err := p.ParseBytes(obj); err == nil {
					cached = timingsInto(t, cached, o)
				}
			}
		}
		return cached
	}
	v, err := p.ParseBytes(body)
	if err != nil {
		return -1
	}
	cached := -1
	if c := v.Get("usage", "prompt_tokens_details", "cached_tokens"); c != nil {
		if n, err := c.Int(); err == nil && n >= 0 {
			cached = n
		}
	}
	if t := v.Get("timings"); hasTimings && t != nil && t.Type() == fastjson.TypeObject {
		cached = timingsInto(t, cached, o)
	}
	return cached
}

// usageBody reads a non-streamed answer's usage: the cached tokens and
// timings usageJSON finds, and the prompt and completion tokens
// usageTokens finds. Over usageScanFrom both read the last usage object,
// so it is parsed once.
func usageBody(p *fastjson.Parser, body []byte, o *affinity.Outcome) (cached, prompt, completion int) {
	if len(body) <= usageScanFrom {
		cached = usageJSON(p, body, o)
		prompt, completion = usageTokens(p, body)
		return cached, prompt, completion
	}
	cached, prompt, completion = -1, -1, -1
	keys := usageKeysIn(body)
	if obj := lastObject(body, strUsage); obj != nil {
		if v, err := p.ParseBytes(obj); err == nil {
			prompt, completion = usageCounts(v)
			if c := v.Get("prompt_tokens_details", "cached_tokens"); keys&keyCached != 0 && c != nil {
				if n, err := c.Int(); err == nil && n >= 0 {
					cached = n
				}
			}
		}
	}
	if keys&keyTimings != 0 {
		if obj := lastObject(body, strTimings); obj != nil {
			if t, err := p.ParseBytes(obj); err == nil {
				cached = timingsInto(t, cached, o)
			}
		}
	}
	return cached, prompt, completion
}

// timingsInto reads llama.cpp's timings object t into o, and returns its
// cache_n when cached (from usage) is unknown.
func timingsInto(t *fastjson.Value, cached int, o *affinity.Outcome) int {
	num := func(k string) float64 {
		f := t.GetFloat64(k)
		if !(f >= 0) || f > 1e12 {
			return 0
		}
		return f
	}
	if cached < 0 && t.Get("cache_n") != nil {
		cached = int(num("cache_n"))
	}
	if pn, pms := num("prompt_n"), num("prompt_ms"); pn > 0 && pms > 0 {
		o.PrefillTokens, o.PrefillSeconds = int(pn), pms/1e3
	}
	if dms := num("predicted_ms"); dms > 0 {
		o.DecodeSeconds = dms / 1e3
	}
	return cached
}

// lastObject returns the JSON object that the last occurrence of key
// (quoted) introduces in body, or nil.
func lastObject(body, key []byte) []byte {
	i := bytes.LastIndex(body, key)
	if i < 0 {
		return nil
	}
	rest := bytes.TrimLeft(body[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	end := objectEnd(rest)
	if end < 0 {
		return nil
	}
	return rest[:end+1]
}

// cachedTokensTail reads cached_tokens from the last "usage" object of a
// large body (engines put usage last), parsing that object alone.
func cachedTokensTail(p *fastjson.Parser, body []byte) int {
	obj := lastObject(body, strUsage)
	if obj == nil {
		return -1
	}
	v, err := p.ParseBytes(obj)
	if err != nil {
		return -1
	}
	c := v.Get("prompt_tokens_details", "cached_tokens")
	if c == nil {
		return -1
	}
	n, err := c.Int()
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// objectEnd returns the index of the '}' closing the JSON object b starts
// with, or -1.
func objectEnd(b []byte) int {
	if len(b) == 0 || b[0] != '{' {
		return -1
	}
	return walkBrackets(b, func(depth int) bool { return depth == 0 })
}
