package workload

import "strconv"

// AppendSegment appends the text of s to dst: s.Tokens pseudo-words of three
// lower-case letters and a space, exactly BytesPerToken bytes each, drawn from
// a generator seeded by s.ID. Equal segments give equal bytes; the text needs
// no JSON escaping.
func AppendSegment(dst []byte, s Segment) []byte {
	x := mix(s.ID)
	for i := 0; i < s.Tokens; i += 2 {
		// splitmix64 step
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		dst = append(dst, 'a'+byte(z%26), 'a'+byte((z>>8)%26), 'a'+byte((z>>16)%26), ' ')
		if i+1 < s.Tokens {
			dst = append(dst, 'a'+byte((z>>24)%26), 'a'+byte((z>>32)%26), 'a'+byte((z>>40)%26), ' ')
		}
	}
	return dst
}

// AppendMessageText appends the concatenated text of a message's segments.
func AppendMessageText(dst []byte, m *Message) []byte {
	for _, s := range m.Segments {
		dst = AppendSegment(dst, s)
	}
	return dst
}

// AppendChatBody appends an OpenAI /v1/chat/completions JSON body for r.
// With stream set it asks for usage in the final chunk.
func AppendChatBody(dst []byte, r *Request, stream bool) []byte {
	return AppendChatBodyWith(dst, r, stream, nil)
}

// AppendChatBodyWith is AppendChatBody with the text of some messages
// replaced: content(mi) returning ok uses its text (JSON-escaped here) for
// message mi instead of the message's segments. A closed-loop chat uses it to
// send the engine's real earlier answers.
func AppendChatBodyWith(dst []byte, r *Request, stream bool, content func(mi int) (text []byte, ok bool)) []byte {
	dst = append(dst, `{"model":`...)
	dst = strconv.AppendQuote(dst, r.Model)
	dst = append(dst, `,"messages":[`...)
	for i := range r.Messages {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"role":"`...)
		dst = append(dst, r.Messages[i].Role.String()...)
		dst = append(dst, `","content":"`...)
		if text, ok := contentOf(content, i); ok {
			dst = appendJSONText(dst, text)
		} else {
			dst = AppendMessageText(dst, &r.Messages[i])
		}
		dst = append(dst, `"}`...)
	}
	dst = append(dst, `],"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.OutputTokens), 10)
	if stream {
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	return append(dst, '}')
}

// AppendChatBodyContent is AppendChatBody with each message's content
// appended by content(dst, mi) as it is (it must need no JSON escaping:
// segment text and enginesim's answers need none). It also returns where
// each message's content lies in the result: spans[mi] = [start, end),
// appended to spans. The cluster simulator writes each message's text once,
// into the body, and renders the engine prompt from those spans.
func AppendChatBodyContent(dst []byte, r *Request, stream bool, content func(dst []byte, mi int) []byte, spans [][2]int) ([]byte, [][2]int) {
	dst = append(dst, `{"model":`...)
	dst = strconv.AppendQuote(dst, r.Model)
	dst = append(dst, `,"messages":[`...)
	for i := range r.Messages {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"role":"`...)
		dst = append(dst, r.Messages[i].Role.String()...)
		dst = append(dst, `","content":"`...)
		start := len(dst)
		dst = content(dst, i)
		spans = append(spans, [2]int{start, len(dst)})
		dst = append(dst, `"}`...)
	}
	dst = append(dst, `],"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.OutputTokens), 10)
	if stream {
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	return append(dst, '}'), spans
}

func contentOf(f func(int) ([]byte, bool), i int) ([]byte, bool) {
	if f == nil {
		return nil, false
	}
	return f(i)
}

// appendJSONText appends text escaped for a JSON string (no quotes).
func appendJSONText(dst, text []byte) []byte {
	const hex = "0123456789abcdef"
	for _, c := range text {
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
