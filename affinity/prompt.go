package affinity

import (
	"encoding/binary"

	"github.com/valyala/fastjson"
)

// Canonical prompt byte format (what is hashed). It approximates the prefix
// an engine's chat template renders, and is stable: the same conversation
// prefix always yields the same leading bytes.
//
// Chat (/v1/chat/completions):
//
//	for each message with role "system" or "developer", in order: MSG
//	if tools present:   0x1E "tools" 0x1F TOOL (0x1F TOOL)*
//	                    TOOL = compact JSON of the tool definition
//	for every other message, in order: MSG
//	MSG = 0x1E role 0x1F [name 0x1F] content [0x1D tool_call_id] [0x1C tool_calls JSON]
//	content: a string as is; an array of parts concatenated, a text part as
//	its text, an image_url part as its url, any other part as compact JSON.
//
// Completions (/v1/completions): `prompt` as a string is its bytes; a token
// id array is each id as 4 bytes little-endian; an array of prompts (batch)
// is its elements joined with 0x1E.
//
// Embeddings: model only (no canonical bytes, no hashes); the token estimate
// counts the input.
//
// Tokens = ceil(text bytes / BytesPerToken) + token ids. Canonical is capped
// at HashConfig.MaxPromptBytes; the token estimate is not.

const (
	sepRecord = 0x1E
	sepUnit   = 0x1F
	sepCallID = 0x1D
	sepCalls  = 0x1C
)

// Parse errors: preallocated FieldErrors (they wrap ErrBadRequest).
var (
	errBadJSON     = &FieldError{Msg: "body is not a JSON object"}
	errBadModel    = &FieldError{Field: "model", Msg: "model must be a non-empty string"}
	errBadMessages = &FieldError{Field: "messages", Msg: "messages must be a non-empty array"}
	errBadMessage  = &FieldError{Field: "messages", Msg: "messages[] must be objects with a string role"}
	errBadPrompt   = &FieldError{Field: "prompt", Msg: "prompt must be a string or an array of strings or token ids"}
	errBadInput    = &FieldError{Field: "input", Msg: "input is required"}
	errBadStream   = &FieldError{Field: "stream", Msg: "stream must be a boolean (true or false)"}
)

// routingFields are the top-level keys the router reads. Engines resolve a
// duplicate key to its last occurrence (Python's json, Go's encoding/json)
// and Go engines match keys case-insensitively, while the router would read
// the first exact match: a body naming one of these twice, or in another
// letter case, is routed one way and served another (model "a" routed,
// model "b" served; a stream buffered; a tenant's cache_salt replaced by
// null). Such a body is refused, naming the field.
var routingFields = [...]string{"model", "stream", "stream_options", "cache_salt", "user",
	"max_tokens", "max_completion_tokens", "messages", "prompt", "input", "tools"}

// errDupIncludeUsage refuses stream_options.include_usage given twice or in
// another case: the router would expect a usage chunk the engine does not
// send (or miss one it does).
var errDupIncludeUsage = &FieldError{Field: "stream_options.include_usage", Msg: "stream_options.include_usage must appear once, spelled in lower case (the body repeats it or has it in another letter case)"}

// errDupField[i] refuses a repeated or differently cased routingFields[i].
var errDupField = dupFieldErrors(routingFields[:])

// dupFieldErrors returns, for each of fields, the error refusing it repeated
// or in another letter case.
func dupFieldErrors(fields []string) []error {
	e := make([]error, len(fields))
	for i, f := range fields {
		e[i] = &FieldError{Field: f, Msg: f + " must appear once, spelled in lower case (the body repeats it or has it in another letter case)"}
	}
	return e
}

// checkKeys refuses a body whose routing fields appear more than once or in
// another letter case. It allocates nothing.
func checkKeys(o *fastjson.Object) error {
	return checkFieldSet(o, routingFields[:], errDupField, len("user"), 3*len("max_completion_tokens"))
}

// checkFieldSet is checkKeys for any set of at most 32 fields (dup their
// dupFieldErrors); keys shorter than minLen or longer than maxLen cannot
// fold to one of them and are skipped without comparing.
func checkFieldSet(o *fastjson.Object, fields []string, dup []error, minLen, maxLen int) error {
	var seen uint32
	var err error
	o.Visit(func(key []byte, _ *fastjson.Value) {
		if err != nil || len(key) < minLen || len(key) > maxLen {
			return
		}
		for i, f := range fields {
			if !foldEqual(key, f) {
				continue
			}
			if seen&(1<<i) != 0 || string(key) != f {
				err = dup[i]
				return
			}
			seen |= 1 << i
			return
		}
	})
	return err
}

// checkIncludeUsage is checkKeys for the one field of stream_options the
// router reads.
func checkIncludeUsage(so *fastjson.Value) error {
	o, err := so.Object()
	if err != nil {
		return nil // not an object: the engine refuses it
	}
	n := 0
	o.Visit(func(key []byte, _ *fastjson.Value) {
		if foldEqual(key, "include_usage") {
			if string(key) != "include_usage" {
				n = 2
			}
			n++
		}
	})
	if n > 1 {
		return errDupIncludeUsage
	}
	return nil
}

// foldEqual reports whether key equals the lower-case ASCII field name f
// under the case folding Go's encoding/json applies to object keys: ASCII
// letters, plus the Kelvin sign (U+212A) for k and the long s (U+017F) for
// s, the two non-ASCII runes that fold to ASCII letters.
func foldEqual(key []byte, f string) bool {
	j := 0
	for i := 0; i < len(key); j++ {
		if j == len(f) {
			return false
		}
		c := key[i]
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
			i++
		case c == 0xE2 && i+2 < len(key) && key[i+1] == 0x84 && key[i+2] == 0xAA:
			c = 'k'
			i += 3
		case c == 0xC5 && i+1 < len(key) && key[i+1] == 0xBF:
			c = 's'
			i += 2
		default:
			i++
		}
		if c != f[j] {
			return false
		}
	}
	return j == len(f)
}

// Parser turns request bodies into a Prompt. It keeps its scratch buffers
// between calls, so after a few requests parsing allocates nothing. A Parser
// is not safe for concurrent use: keep one per goroutine or in a sync.Pool.
type Parser struct {
	key   uint64 // mixed into every chain seed (NewKeyedParser); 0 = unkeyed
	cfg   HashConfig
	block int
	jp    fastjson.Parser
	canon []byte
	meta  []byte // model, user and cache_salt copied by the scanner
	hash  []uint64
	text  int // text bytes counted toward the token estimate
	ids   int // token ids counted
}

// NewParser returns a Parser; cfg zero fields take defaults. An invalid cfg
// is replaced by the defaults (validate it with HashConfig.Validate first).
func NewParser(cfg HashConfig) *Parser {
	if cfg.Validate() != nil {
		cfg = HashConfig{}
	}
	cfg = cfg.WithDefaults()
	return &Parser{cfg: cfg, block: cfg.BlockBytes()}
}

// NewKeyedParser is NewParser whose hashes are keyed: key is mixed into
// every chain seed, so without it nobody can compute the hash of a guessed
// prompt (the hashes leave the process in cluster messages). Every parser
// feeding one Router, and every instance of a fleet, must use the same key.
// The keying is not a MAC: it raises the bar from "hash the guess" to
// "recover a 64-bit secret".
func NewKeyedParser(cfg HashConfig, key uint64) *Parser {
	p := NewParser(cfg)
	p.key = key
	return p
}

// HashConfig returns the parser's effective configuration.
func (p *Parser) HashConfig() HashConfig { return p.cfg }

func (p *Parser) begin(body []byte, out *Prompt) (*fastjson.Value, error) {
	*out = Prompt{}
	p.canon = p.canon[:0]
	p.hash = p.hash[:0]
	p.text, p.ids = 0, 0
	v, err := p.jp.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return nil, errBadJSON
	}
	o, _ := v.Object()
	if err := checkKeys(o); err != nil {
		return nil, err
	}
	out.Model = v.GetStringBytes("model")
	if len(out.Model) == 0 {
		return nil, errBadModel
	}
	if st := o.Get("stream"); st != nil {
		switch st.Type() {
		case fastjson.TypeTrue:
			out.Stream = true
		case fastjson.TypeFalse, fastjson.TypeNull:
		default:
			// vLLM's pydantic reads "true" and 1 as true; the router would
			// read false and buffer a stream.
			return nil, errBadStream
		}
	}
	if so := o.Get("stream_options"); so != nil {
		if err := checkIncludeUsage(so); err != nil {
			return nil, err
		}
	}
	out.IncludeUsage = v.GetBool("stream_options", "include_usage")
	out.User = v.GetStringBytes("user")
	out.CacheSalt = v.GetStringBytes("cache_salt")
	out.MaxTokens = v.GetInt("max_completion_tokens")
	if out.MaxTokens == 0 {
		out.MaxTokens = v.GetInt("max_tokens")
	}
	return v, nil
}

func (p *Parser) finish(out *Prompt) {
	out.Canonical = p.canon
	p.hash = AppendHashes(p.hash, Seed(out.Model, out.CacheSalt)^p.key, p.canon, p.block)
	out.Hashes = p.hash
	bpt := p.cfg.BytesPerToken
	out.Tokens = (p.text+bpt-1)/bpt + p.ids
}

// appendText adds text bytes to the canonical prompt, up to the cap.
func (p *Parser) appendText(b []byte) {
	p.text += len(b)
	if room := p.cfg.MaxPromptBytes - len(p.canon); room < len(b) {
		b = b[:max(room, 0)]
	}
	p.canon = append(p.canon, b...)
}

func (p *Parser) appendByte(c byte) {
	p.text++
	if len(p.canon) < p.cfg.MaxPromptBytes {
		p.canon = append(p.canon, c)
	}
}

// appendJSON adds v as compact JSON.
func (p *Parser) appendJSON(v *fastjson.Value) {
	n := len(p.canon)
	p.canon = v.MarshalTo(p.canon)
	p.text += len(p.canon) - n
	if len(p.canon) > p.cfg.MaxPromptBytes {
		p.canon = p.canon[:p.cfg.MaxPromptBytes]
	}
}

func (p *Parser) appendTokenID(id uint64) {
	p.ids++
	if len(p.canon)+4 <= p.cfg.MaxPromptBytes {
		p.canon = binary.LittleEndian.AppendUint32(p.canon, uint32(id))
	}
}

// ParseChat parses a /v1/chat/completions body: the one-pass scanner for
// the shapes clients send (scan.go), fastjson for the rest and for errors.
func (p *Parser) ParseChat(body []byte, out *Prompt) error {
	if p.scanChat(body, out) {
		return nil
	}
	return p.parseChatJSON(body, out)
}

// parseChatJSON is ParseChat through fastjson's parse tree: the reference
// the scanner is tested against, and the path for every body it leaves.
func (p *Parser) parseChatJSON(body []byte, out *Prompt) error {
	v, err := p.begin(body, out)
	if err != nil {
		return err
	}
	msgs := v.GetArray("messages")
	if len(msgs) == 0 {
		return errBadMessages
	}
	for _, m := range msgs {
		role := m.GetStringBytes("role")
		if m.Type() != fastjson.TypeObject || len(role) == 0 {
			return errBadMessage
		}
		if isSystem(role) {
			p.appendMessage(m, role)
		}
	}
	if tools := v.GetArray("tools"); len(tools) > 0 {
		p.appendByte(sepRecord)
		p.appendText(toolsTag)
		for _, t := range tools {
			p.appendByte(sepUnit)
			p.appendJSON(t)
		}
	}
	for _, m := range msgs {
		if role := m.GetStringBytes("role"); !isSystem(role) {
			p.appendMessage(m, role)
		}
	}
	p.finish(out)
	return nil
}

var toolsTag = []byte("tools")

func isSystem(role []byte) bool {
	return string(role) == "system" || string(role) == "developer"
}

func (p *Parser) appendMessage(m *fastjson.Value, role []byte) {
	p.appendByte(sepRecord)
	p.appendText(role)
	p.appendByte(sepUnit)
	if name := m.GetStringBytes("name"); len(name) > 0 {
		p.appendText(name)
		p.appendByte(sepUnit)
	}
	p.appendContent(m.Get("content"), false)
	if id := m.GetStringBytes("tool_call_id"); len(id) > 0 {
		p.appendByte(sepCallID)
		p.appendText(id)
	}
	if calls := m.Get("tool_calls"); calls != nil && calls.Type() == fastjson.TypeArray {
		p.appendByte(sepCalls)
		p.appendJSON(calls)
	}
}

// appendContent appends a message's content: a string as text, an array
// part by part (chat's parts, or the Responses API's when responses), any
// other value but null as JSON.
func (p *Parser) appendContent(c *fastjson.Value, responses bool) {
	switch {
	case c == nil:
	case c.Type() == fastjson.TypeString:
		s, _ := c.StringBytes()
		p.appendText(s)
	case c.Type() == fastjson.TypeArray:
		parts, _ := c.Array()
		for _, part := range parts {
			if responses {
				p.appendResponsesPart(part)
			} else {
				p.appendPart(part)
			}
		}
	case c.Type() != fastjson.TypeNull:
		p.appendJSON(c)
	}
}

func (p *Parser) appendPart(part *fastjson.Value) {
	if part.Type() == fastjson.TypeString {
		s, _ := part.StringBytes()
		p.appendText(s)
		return
	}
	switch string(part.GetStringBytes("type")) {
	case "text", "input_text":
		if t := part.Get("text"); t != nil && t.Type() == fastjson.TypeString {
			s, _ := t.StringBytes()
			p.appendText(s)
			return
		}
	case "image_url":
		if u := part.GetStringBytes("image_url", "url"); u != nil {
			p.appendText(u)
			return
		}
	}
	p.appendJSON(part)
}

// ParseCompletion parses a /v1/completions body.
func (p *Parser) ParseCompletion(body []byte, out *Prompt) error {
	v, err := p.begin(body, out)
	if err != nil {
		return err
	}
	pr := v.Get("prompt")
	if pr == nil {
		return errBadPrompt
	}
	switch pr.Type() {
	case fastjson.TypeString:
		s, _ := pr.StringBytes()
		p.appendText(s)
	case fastjson.TypeArray:
		arr, _ := pr.Array()
		for i, e := range arr {
			switch e.Type() {
			case fastjson.TypeString:
				if i > 0 {
					p.appendByte(sepRecord)
				}
				s, _ := e.StringBytes()
				p.appendText(s)
			case fastjson.TypeNumber:
				id, err := e.Uint64()
				if err != nil {
					return errBadPrompt
				}
				p.appendTokenID(id)
			case fastjson.TypeArray:
				if i > 0 {
					p.appendByte(sepRecord)
				}
				ids, _ := e.Array()
				for _, t := range ids {
					id, err := t.Uint64()
					if err != nil {
						return errBadPrompt
					}
					p.appendTokenID(id)
				}
			default:
				return errBadPrompt
			}
		}
	default:
		return errBadPrompt
	}
	p.finish(out)
	return nil
}

// ParseEmbedding parses a /v1/embeddings body: model, user and a token
// estimate of the input; no canonical bytes or hashes (embedding engines do
// not reuse a prefix cache across requests).
func (p *Parser) ParseEmbedding(body []byte, out *Prompt) error {
	v, err := p.begin(body, out)
	if err != nil {
		return err
	}
	in := v.Get("input")
	if in == nil {
		return errBadInput
	}
	p.countInput(in, 0)
	bpt := p.cfg.BytesPerToken
	out.Tokens = (p.text+bpt-1)/bpt + p.ids
	return nil
}

func (p *Parser) countInput(v *fastjson.Value, depth int) {
	switch v.Type() {
	case fastjson.TypeString:
		s, _ := v.StringBytes()
		p.text += len(s)
	case fastjson.TypeNumber:
		p.ids++
	case fastjson.TypeArray:
		if depth > 2 {
			return
		}
		arr, _ := v.Array()
		for _, e := range arr {
			p.countInput(e, depth+1)
		}
	}
}

// Fill sets req from the parsed prompt: model, hashes and token estimate
// alias pr (valid until the Parser's next call); the session key comes from
// the `user` field (override it with a session header if you have one);
// Buffered is set for non-streaming requests.
func (pr *Prompt) Fill(req *Request, now int64) {
	*req = Request{
		Model:        pr.Model,
		Hashes:       pr.Hashes,
		PromptTokens: pr.Tokens,
		SessionKey:   SessionKey(pr.User),
		Now:          now,
		Buffered:     !pr.Stream,
	}
}
