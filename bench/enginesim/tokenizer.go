package enginesim

// The engine's tokenizer is deliberately simple and deterministic: token i
// of a byte stream is bytes [4i, 4i+4) (the last one may be shorter), so a
// prompt of n bytes is ceil(n/4) tokens. Two prompts share their leading
// tokens exactly as far as they share leading 4-byte chunks.
//
// The chat template renders every message as a header, the content padded
// with spaces to a multiple of 4 bytes, and an end marker, so no token
// straddles two messages (real BPE tokenizers get the same effect from their
// special tokens) and two chats that share leading messages share leading
// tokens. System and developer messages come first, then tools, then the
// other messages in order:
//
//	<|system|>\n   content...pad   </s>
//	<|tools|>\n    tools JSON...pad </s>
//	<|user|>\n\n\n content...pad   </s>
//	<|assistant|>\n\n                  (generation prompt)
//
// Generated tokens are 4-byte words, so an assistant answer sent back in the
// next turn renders to exactly the bytes the engine generated (plus "</s>")
// and multi-turn chats reuse the previous answer's KV blocks too.

// BytesPerToken is the tokenizer's fixed ratio.
const BytesPerToken = 4

// eosText is the end-of-sequence token and the template's end marker.
const eosText = "</s>"

// tokensOf returns the token count of n prompt bytes.
func tokensOf(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }

// Message is one chat message as the template sees it.
type Message struct {
	Role    string
	Content string
}

// AppendChatPrompt appends the engine's rendering of a chat (the template
// above) to dst: system and developer messages first, then tools (raw JSON,
// may be empty), then the rest, then the assistant generation prompt.
func AppendChatPrompt(dst []byte, msgs []Message, tools []byte) []byte {
	for i := range msgs {
		if isSystemRole(msgs[i].Role) {
			dst = appendMessage(dst, msgs[i].Role, msgs[i].Content)
		}
	}
	if len(tools) > 0 {
		dst = appendMessage(dst, "tools", string(tools))
	}
	for i := range msgs {
		if !isSystemRole(msgs[i].Role) {
			dst = appendMessage(dst, msgs[i].Role, msgs[i].Content)
		}
	}
	return appendHeader(dst, "assistant")
}

func isSystemRole(role string) bool { return role == "system" || role == "developer" }

func appendMessage(dst []byte, role, content string) []byte {
	dst = appendHeader(dst, role)
	dst = append(dst, content...)
	for pad := (4 - len(content)%4) % 4; pad > 0; pad-- {
		dst = append(dst, ' ')
	}
	return append(dst, eosText...)
}

// appendHeader appends "<|role|>\n" padded with newlines to a multiple of 4.
func appendHeader(dst []byte, role string) []byte {
	dst = append(dst, "<|"...)
	dst = append(dst, role...)
	dst = append(dst, "|>\n"...)
	for pad := (4 - (len(role)+5)%4) % 4; pad > 0; pad-- {
		dst = append(dst, '\n')
	}
	return dst
}

// words is the output vocabulary: every word is exactly one 4-byte token.
var words = [64]string{
	"the ", "and ", "for ", "are ", "but ", "not ", "you ", "all ",
	"any ", "can ", "had ", "her ", "was ", "one ", "our ", "out ",
	"day ", "get ", "has ", "him ", "his ", "how ", "man ", "new ",
	"now ", "old ", "see ", "two ", "way ", "who ", "boy ", "did ",
	"its ", "let ", "put ", "say ", "she ", "too ", "use ", "key ",
	"gpu ", "hot ", "fan ", "map ", "bit ", "row ", "log ", "net ",
	"box ", "cpu ", "ram ", "tcp ", "udp ", "xdp ", "bpf ", "dns ",
	"api ", "sdk ", "llm ", "web ", "run ", "job ", "top ", "end ",
}

// splitmix64 is the output generator's mixer.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// outputWord returns output token i of the stream keyed by key.
func outputWord(key uint64, i int) string {
	return words[splitmix64(key+uint64(i)*0x9e3779b97f4a7c15)&63]
}
