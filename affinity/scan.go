// Long because it is one job: the one-pass chat scanner is a single state
// machine over the body; what it does not handle goes to prompt.go's parser.

package affinity

import (
	"bytes"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/valyala/fastjson/fastfloat"
)

// One-pass chat scanner.
//
// scanChat reads a /v1/chat/completions body once, left to right, and
// appends each message's canonical bytes as its content string is scanned:
// a string is copied once from the body with its escapes decoded on the way
// (no parse tree, no copy of the body, no second pass to unescape), and the
// blocks are hashed once at the end. It handles the shapes clients send: a
// top-level object with system/developer messages before the others, string
// roles, content as a string or as text parts, no tools or tool_calls.
// Anything else (an invalid escape, an escape in a key, model, role or
// name, a duplicate routing key, tools, image parts, a nesting deeper than
// scanMaxDepth, any error) makes it report false, and ParseChat parses the
// body with fastjson instead, which decides the result and the error. So on
// every body it accepts, scanChat gives exactly what parseChatJSON gives
// (TestScanChatMatchesJSON, FuzzScanChat): its JSON grammar is strict where
// fastjson is lax, never the other way round.

const scanMaxDepth = 64

// scanner state for one body.
type chatScan struct {
	p        *Parser
	b        []byte
	sawOther bool // a message other than system/developer was appended
}

// span is a value's byte range in the body; set reports presence.
type span struct {
	lo, hi int
	set    bool
}

func isWS(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

func (s *chatScan) ws(i int) int {
	for i < len(s.b) && isWS(s.b[i]) {
		i++
	}
	return i
}

// scanChat is ParseChat's fast path; false means "parse with fastjson".
func (p *Parser) scanChat(body []byte, out *Prompt) bool {
	*out = Prompt{}
	p.canon = p.canon[:0]
	p.hash = p.hash[:0]
	p.text, p.ids = 0, 0
	s := chatScan{p: p, b: body}
	var (
		model, user, salt span
		stream, usage     bool
		mct, mt           int
		msgs              bool
		seen              uint32
	)
	i := s.ws(0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i = s.ws(i + 1)
	if i < len(body) && body[i] == '}' {
		return false // no model
	}
	for {
		key, j, ok := s.member(i)
		if !ok {
			return false
		}
		i = j
		field := -1
		if len(key) >= len("user") && len(key) <= 3*len("max_completion_tokens") {
			for f, name := range routingFields {
				if foldEqual(key, name) {
					if seen&(1<<f) != 0 || string(key) != name {
						return false // refused by checkKeys
					}
					seen |= 1 << f
					field = f
					break
				}
			}
		}
		var name string
		if field >= 0 {
			name = routingFields[field]
		}
		switch name {
		case "model", "user", "cache_salt":
			var sp span
			if i < len(body) && body[i] == '"' {
				end, esc, ok := s.str(i)
				if !ok || esc {
					return false
				}
				sp = span{i + 1, end - 1, true}
				i = end
			} else if i, ok = s.skip(i, 0); !ok {
				return false
			}
			switch name {
			case "model":
				model = sp
			case "user":
				user = sp
			default:
				salt = sp
			}
		case "stream":
			switch {
			case bytes.HasPrefix(body[i:], litTrue):
				stream, i = true, i+4
			case bytes.HasPrefix(body[i:], litFalse):
				i += 5
			case bytes.HasPrefix(body[i:], litNull):
				i += 4
			default:
				return false
			}
		case "stream_options":
			if i, usage, ok = s.streamOptions(i); !ok {
				return false
			}
		case "max_tokens", "max_completion_tokens":
			lo := i
			if i, ok = s.skip(i, 0); !ok {
				return false
			}
			n := 0
			if c := body[lo]; c == '-' || ('0' <= c && c <= '9') {
				n = int(fastfloat.ParseInt64BestEffort(b2s(body[lo:i])))
			}
			if name == "max_tokens" {
				mt = n
			} else {
				mct = n
			}
		case "messages":
			if i, ok = s.messages(i); !ok {
				return false
			}
			msgs = true
		case "tools":
			if i < len(body) && body[i] == '[' {
				if j := s.ws(i + 1); j >= len(body) || body[j] != ']' {
					return false // tools go between the system and other messages
				}
			}
			if i, ok = s.skip(i, 0); !ok {
				return false
			}
		default:
			if i, ok = s.skip(i, 0); !ok {
				return false
			}
		}
		i = s.ws(i)
		if i >= len(body) {
			return false
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return false
		}
		i = s.ws(i + 1)
	}
	if s.ws(i+1) != len(body) || !msgs || model.hi <= model.lo {
		return false
	}
	// Model, user and salt point into the Parser's scratch, as they point
	// into fastjson's copy of the body on the other path: the caller may
	// reuse the body buffer.
	p.meta = append(p.meta[:0], body[model.lo:model.hi]...)
	p.meta = append(p.meta, body[user.lo:user.hi]...)
	p.meta = append(p.meta, body[salt.lo:salt.hi]...)
	nm, nu := model.hi-model.lo, user.hi-user.lo
	out.Model = p.meta[:nm:nm]
	if user.set {
		out.User = p.meta[nm : nm+nu : nm+nu]
	}
	if salt.set {
		out.CacheSalt = p.meta[nm+nu : len(p.meta) : len(p.meta)]
	}
	out.Stream, out.IncludeUsage = stream, usage
	out.MaxTokens = mct
	if out.MaxTokens == 0 {
		out.MaxTokens = mt
	}
	p.finish(out)
	return true
}

var (
	litTrue  = []byte("true")
	litFalse = []byte("false")
	litNull  = []byte("null")
)

// key reads an object key at i (which must be a string without escapes) and
// returns its bounds; b[khi] is its closing quote.
func (s *chatScan) key(i int) (klo, khi int, ok bool) {
	if i >= len(s.b) || s.b[i] != '"' {
		return 0, 0, false
	}
	end, esc, ok := s.str(i)
	if !ok || esc {
		return 0, 0, false
	}
	return i + 1, end - 1, true
}

// member reads an object member's key at i and the colon after it; j is
// where its value starts.
func (s *chatScan) member(i int) (key []byte, j int, ok bool) {
	klo, khi, ok := s.key(i)
	if !ok {
		return nil, 0, false
	}
	j = s.ws(khi + 1)
	if j >= len(s.b) || s.b[j] != ':' {
		return nil, 0, false
	}
	return s.b[klo:khi], s.ws(j + 1), true
}

// str scans the string starting at b[i] == '"'; end is the index after its
// closing quote, esc whether it holds an escape. Every escape is checked.
func (s *chatScan) str(i int) (end int, esc bool, ok bool) {
	b := s.b
	i++
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false, false
		}
		q += i
		j := i
		for {
			k := bytes.IndexByte(b[j:q], '\\')
			if k < 0 {
				break
			}
			esc = true
			j += k
			n := escLen(b[j:])
			if n == 0 {
				return 0, false, false
			}
			if j += n; j > q {
				break // the quote was escaped
			}
		}
		if j <= q {
			return q + 1, esc, true
		}
		i = j
	}
}

// escLen is the length of the escape at b[0] == '\\' (2, or 6 for \uXXXX),
// 0 when it is not one JSON allows.
func escLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(b) < 6 {
			return 0
		}
		for _, c := range b[2:6] {
			if hexVal(c) < 0 {
				return 0
			}
		}
		return 6
	}
	return 0
}

func hexVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func hex4(b []byte) rune {
	return rune(hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3]))
}

// emitString appends the string at b[i] == '"' to the canonical prompt,
// unescaped as fastjson unescapes it, and returns the index after it.
func (s *chatScan) emitString(i int) (int, bool) {
	b, p := s.b, s.p
	i++
	q := -1 // generic path: the next quote at or after i, valid while q >= i
	for {
		if hasUnescapePlain && len(p.canon)+len(b)-i <= p.cfg.MaxPromptBytes {
			// one pass: copy and decode two-byte escapes up to the closing
			// quote or a \u escape
			n := len(p.canon)
			p.canon = slices.Grow(p.canon, len(b)-i)[:n+len(b)-i]
			c, w := unescapePlain(p.canon[n:], b[i:])
			p.canon = p.canon[:n+w]
			p.text += w
			if i += c; i == len(b) {
				return 0, false
			}
		} else {
			if q < i {
				if q = bytes.IndexByte(b[i:], '"'); q < 0 {
					return 0, false
				}
				q += i
			}
			e := bytes.IndexByte(b[i:q], '\\')
			if e < 0 {
				e = q - i
			}
			p.appendText(b[i : i+e])
			i += e
		}
		if b[i] == '"' {
			return i + 1, true
		}
		n := escLen(b[i:])
		if n == 0 {
			return 0, false
		}
		switch c := b[i+1]; c {
		case '"', '\\', '/':
			p.appendByte(c)
		case 'b':
			p.appendByte('\b')
		case 'f':
			p.appendByte('\f')
		case 'n':
			p.appendByte('\n')
		case 'r':
			p.appendByte('\r')
		case 't':
			p.appendByte('\t')
		case 'u':
			x := hex4(b[i+2:])
			if !utf16.IsSurrogate(x) {
				s.appendRune(x)
				break
			}
			// fastjson pairs a surrogate with a following \uXXXX (any
			// value: utf16.DecodeRune gives U+FFFD for a bad pair) and
			// keeps a lone one as its six escape bytes.
			t := b[i+6:]
			if len(t) < 6 || t[0] != '\\' || t[1] != 'u' || escLen(t) != 6 {
				p.appendText(b[i : i+6])
				break
			}
			s.appendRune(utf16.DecodeRune(x, hex4(t[2:])))
			n = 12
		}
		i += n
	}
}

func (s *chatScan) appendRune(r rune) {
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	s.p.appendText(buf[:n])
}

// skip validates and skips the value at b[i]; it returns the index after it.
func (s *chatScan) skip(i, depth int) (int, bool) {
	b := s.b
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; {
	case c == '"':
		end, _, ok := s.str(i)
		return end, ok
	case c == '{' || c == '[':
		if depth >= scanMaxDepth {
			return 0, false
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = s.ws(i + 1)
		if i < len(b) && b[i] == closer {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if _, khi, ok := s.key(i); !ok {
					return 0, false
				} else {
					i = s.ws(khi + 1)
				}
				if i >= len(b) || b[i] != ':' {
					return 0, false
				}
				i = s.ws(i + 1)
			}
			if i, ok = s.skip(i, depth+1); !ok {
				return 0, false
			}
			i = s.ws(i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == closer {
				return i + 1, true
			}
			if b[i] != ',' {
				return 0, false
			}
			i = s.ws(i + 1)
		}
	case c == 't':
		return i + 4, bytes.HasPrefix(b[i:], litTrue)
	case c == 'f':
		return i + 5, bytes.HasPrefix(b[i:], litFalse)
	case c == 'n':
		return i + 4, bytes.HasPrefix(b[i:], litNull)
	default:
		return s.number(i)
	}
}

// number skips a number in JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *chatScan) number(i int) (int, bool) {
	b := s.b
	digits := func(i int) (int, bool) {
		j := i
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
		return j, j > i
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else {
		var ok bool
		if i, ok = digits(i); !ok {
			return 0, false
		}
	}
	if i < len(b) && b[i] == '.' {
		var ok bool
		if i, ok = digits(i + 1); !ok {
			return 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		var ok bool
		if i, ok = digits(i); !ok {
			return 0, false
		}
	}
	return i, true
}

// streamOptions reads stream_options: include_usage is true when its one
// lower-case occurrence is `true` (checkIncludeUsage refuses more).
func (s *chatScan) streamOptions(i int) (int, bool, bool) {
	b := s.b
	if i >= len(b) || b[i] != '{' {
		j, ok := s.skip(i, 0)
		return j, false, ok
	}
	usage, n := false, 0
	i = s.ws(i + 1)
	if i < len(b) && b[i] == '}' {
		return i + 1, false, true
	}
	for {
		key, j, ok := s.member(i)
		if !ok {
			return 0, false, false
		}
		i = j
		if foldEqual(key, "include_usage") {
			if n++; n > 1 || string(key) != "include_usage" {
				return 0, false, false
			}
			usage = bytes.HasPrefix(b[i:], litTrue)
		}
		if i, ok = s.skip(i, 1); !ok {
			return 0, false, false
		}
		var done bool
		if i, done, ok = s.next(i, '}'); !ok {
			return 0, false, false
		}
		if done {
			return i, usage, true
		}
	}
}

// messages reads the messages array, appending each message.
func (s *chatScan) messages(i int) (int, bool) {
	b := s.b
	if i >= len(b) || b[i] != '[' {
		return 0, false
	}
	i = s.ws(i + 1)
	if i < len(b) && b[i] == ']' {
		return 0, false // empty: errBadMessages
	}
	for {
		var ok bool
		if i, ok = s.message(i); !ok {
			return 0, false
		}
		var done bool
		if i, done, ok = s.next(i, ']'); !ok || done {
			return i, ok
		}
	}
}

// next reads what follows an array element or object member ending at i:
// the closing bracket or brace (done, next past it) or a comma and the
// whitespace after it.
func (s *chatScan) next(i int, close byte) (next int, done, ok bool) {
	b := s.b
	i = s.ws(i)
	switch {
	case i >= len(b):
		return 0, false, false
	case b[i] == close:
		return i + 1, true, true
	case b[i] != ',':
		return 0, false, false
	}
	return s.ws(i + 1), false, true
}

// message reads one message object. Its content is appended while it is
// scanned when the role (and name) came first, as clients write them;
// otherwise the content is skipped and appended from its span at the end.
func (s *chatScan) message(i int) (int, bool) {
	b, p := s.b, s.p
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	var (
		role, name, callID, content span
		roleSeen, nameSeen, idSeen  bool
		contentSeen, emitted        bool
	)
	i = s.ws(i + 1)
	if i < len(b) && b[i] == '}' {
		return 0, false // no role
	}
	for {
		key, j, ok := s.member(i)
		if !ok {
			return 0, false
		}
		i = j
		switch {
		case !roleSeen && string(key) == "role":
			roleSeen = true
			if role, i, ok = s.strField(i); !ok || !role.set || role.hi == role.lo {
				return 0, false
			}
		case !nameSeen && string(key) == "name":
			nameSeen = true
			if name, i, ok = s.strField(i); !ok {
				return 0, false
			}
			if emitted && name.set && name.hi > name.lo {
				return 0, false // the name goes before the content
			}
		case !idSeen && string(key) == "tool_call_id":
			idSeen = true
			if callID, i, ok = s.strField(i); !ok {
				return 0, false
			}
		case !contentSeen && string(key) == "content":
			contentSeen = true
			if roleSeen {
				if !s.header(b[role.lo:role.hi], name) {
					return 0, false
				}
				emitted = true
				if i, ok = s.content(i); !ok {
					return 0, false
				}
				break
			}
			content = span{lo: i, set: true}
			if i, ok = s.skip(i, 2); !ok {
				return 0, false
			}
		case string(key) == "tool_calls":
			if i < len(b) && b[i] == '[' {
				return 0, false // appended as JSON
			}
			fallthrough
		default:
			if i, ok = s.skip(i, 2); !ok {
				return 0, false
			}
		}
		var done bool
		if i, done, ok = s.next(i, '}'); !ok {
			return 0, false
		}
		if done {
			break
		}
	}
	if !roleSeen {
		return 0, false
	}
	if !emitted {
		if !s.header(b[role.lo:role.hi], name) {
			return 0, false
		}
		if content.set {
			if _, ok := s.content(content.lo); !ok {
				return 0, false
			}
		}
	}
	if callID.set && callID.hi > callID.lo {
		p.appendByte(sepCallID)
		p.appendText(b[callID.lo:callID.hi])
	}
	return i, true
}

// strField reads a field whose value is used only when it is a string
// without escapes; another type yields an unset span.
func (s *chatScan) strField(i int) (span, int, bool) {
	if i < len(s.b) && s.b[i] == '"' {
		end, esc, ok := s.str(i)
		if !ok || esc {
			return span{}, 0, false
		}
		return span{i + 1, end - 1, true}, end, true
	}
	j, ok := s.skip(i, 2)
	return span{}, j, ok
}

// header appends a message's record start, role and name, refusing a system
// or developer message after another kind (those go first).
func (s *chatScan) header(role []byte, name span) bool {
	p := s.p
	if isSystem(role) {
		if s.sawOther {
			return false
		}
	} else {
		s.sawOther = true
	}
	p.appendByte(sepRecord)
	p.appendText(role)
	p.appendByte(sepUnit)
	if name.set && name.hi > name.lo {
		p.appendText(s.b[name.lo:name.hi])
		p.appendByte(sepUnit)
	}
	return true
}

// content appends a message's content at b[i]: a string, null, or an array
// of strings and text parts.
func (s *chatScan) content(i int) (int, bool) {
	b := s.b
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return s.emitString(i)
	case 'n':
		return i + 4, bytes.HasPrefix(b[i:], litNull)
	case '[':
	default:
		return 0, false // appended as JSON
	}
	i = s.ws(i + 1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i < len(b) && b[i] == '"' {
			i, ok = s.emitString(i)
		} else {
			i, ok = s.part(i)
		}
		if !ok {
			return 0, false
		}
		var done bool
		if i, done, ok = s.next(i, ']'); !ok || done {
			return i, ok
		}
	}
}

// part appends a text part ({"type":"text"|"input_text","text":"..."});
// any other part is appended as JSON, which the scanner leaves to fastjson.
func (s *chatScan) part(i int) (int, bool) {
	b := s.b
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	var (
		typ, text         span
		typSeen, textSeen bool
		emitted           bool
	)
	i = s.ws(i + 1)
	if i < len(b) && b[i] == '}' {
		return 0, false
	}
	for {
		key, j, ok := s.member(i)
		if !ok {
			return 0, false
		}
		i = j
		switch {
		case !typSeen && string(key) == "type":
			typSeen = true
			if typ, i, ok = s.strField(i); !ok || !isTextPart(b, typ) {
				return 0, false
			}
		case !textSeen && string(key) == "text":
			textSeen = true
			if i >= len(b) || b[i] != '"' {
				return 0, false // appended as JSON
			}
			if typSeen {
				emitted = true
				if i, ok = s.emitString(i); !ok {
					return 0, false
				}
				break
			}
			text = span{lo: i, set: true}
			if i, ok = s.skip(i, 4); !ok {
				return 0, false
			}
		default:
			if i, ok = s.skip(i, 4); !ok {
				return 0, false
			}
		}
		var done bool
		if i, done, ok = s.next(i, '}'); !ok {
			return 0, false
		}
		if done {
			break
		}
	}
	if !typSeen || !textSeen {
		return 0, false
	}
	if !emitted {
		if _, ok := s.emitString(text.lo); !ok {
			return 0, false
		}
	}
	return i, true
}

func isTextPart(b []byte, typ span) bool {
	t := b[typ.lo:typ.hi]
	return typ.set && (string(t) == "text" || string(t) == "input_text")
}

// b2s views b as a string without copying (b is not modified meanwhile).
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
