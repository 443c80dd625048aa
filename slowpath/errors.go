package slowpath

import (
	"github.com/valyala/fasthttp"
)

// OpenAI-style error types.
const (
	errTypeInvalid     = "invalid_request_error"
	errTypeRateLimit   = "rate_limit_exceeded"
	errTypeUnavailable = "service_unavailable"
	errTypeUpstream    = "upstream_error"
)

var (
	strContentTypeJSON = []byte("application/json")
)

// writeError writes {"error":{"message","type","param","code"}}. param and
// code are JSON null when empty. msg and the parts are JSON-escaped.
func writeError(ctx *fasthttp.RequestCtx, status int, msg, typ, param, code string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(strContentTypeJSON)
	var buf [256]byte
	ctx.SetBody(AppendError(buf[:0], msg, typ, param, code))
}

// AppendError appends an OpenAI-style error body to dst.
func AppendError(dst []byte, msg, typ, param, code string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, typ)
	dst = append(dst, `,"param":`...)
	if param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendJSONString(dst, param)
	}
	dst = append(dst, `,"code":`...)
	if code == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendJSONString(dst, code)
	}
	return append(dst, "}}"...)
}

const hexDigits = "0123456789abcdef"

func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
