package slowpath

import (
	"errors"
	"io"
	"net/netip"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"github.com/warmpath/warmpath/affinity"
)

// The exchange: one proxied request's state, pooled, and the header names
// the proxy writes without per-request conversions.

type endpoint uint8

const (
	epChat endpoint = iota
	epCompletion
	epEmbedding
	epResponses // /v1/responses (responses.go)
	epPassJSON  // model-routed JSON pass-through: /tokenize, /v1/rerank, ... (passthrough.go)
	epPassMulti // model-routed multipart pass-through: /v1/audio/* (passthrough.go)
	epFixed     // no model: the target replica is chosen before forward (passthrough.go)
)

// package-level header names and paths: no per-request conversions.
var (
	hdrConnection      = []byte("Connection")
	hdrKeepAlive       = []byte("Keep-Alive")
	hdrProxyConnection = []byte("Proxy-Connection")
	hdrTE              = []byte("Te")
	hdrTrailer         = []byte("Trailer")
	hdrTransferEnc     = []byte("Transfer-Encoding")
	hdrUpgrade         = []byte("Upgrade")
	hdrAcceptEncoding  = []byte("Accept-Encoding")
	hdrExpect          = []byte("Expect")
	hdrXForwardedFor   = []byte("X-Forwarded-For")
	hdrContentLength   = []byte("Content-Length")
	hdrAllow           = []byte("Allow")
	hdrRetryAfter      = []byte("Retry-After")
	hdrXRealIP         = []byte("X-Real-Ip")
	hdrForwarded       = []byte("Forwarded")

	strPOST = []byte("POST")
	strGET  = []byte("GET")
	strOne  = []byte("1")

	strDataPrefix   = []byte("data:")
	strCachedTokens = []byte(`"cached_tokens"`)
	strTimings      = []byte(`"timings"`)
	strRole         = []byte(`"role"`)
	strContent      = []byte(`"content"`)
	strAppJSON      = []byte("application/json")
)

var (
	errNoKnownMetrics = errors.New("no known engine metric names")
)

// maxSSELine bounds the bytes kept to find the usage chunk; longer lines are
// forwarded untouched but not inspected.
const maxSSELine = 64 << 10

// maxPooledPrompt: exchanges whose parser scratch grew beyond this are not
// kept, so a few huge prompts do not pin memory.
const maxPooledPrompt = 1 << 20

// exchange is one proxied request's state. Pooled; for streams it lives until
// fasthttp has written the body and calls CloseWithError.
type exchange struct {
	errSent int // bytes of sseBroken already relayed
	// holdLocked: ex holds s.holdMu, woken from a slot hold, until its
	// attempt began (holdSlot).
	holdLocked bool
	s          *Server
	parser     *affinity.Parser
	prompt     affinity.Prompt
	req        affinity.Request
	dec        affinity.Decision
	flight     affinity.Flight
	ep         endpoint
	api        apiState // Responses pinning and pass-through state (responses.go)

	model   []byte // copy of the model name; the request body is gone when a stream ends
	salted  []byte // the body with an injected tenant cache_salt (tenancy on)
	h10     []byte // an HTTP/1.0 client's stream header (relayHTTP10)
	scratch []byte
	rep     *replica
	mm      *modelMetrics
	pred    int
	decided int64 // s.now() after the decision (the Flight's start)
	start   int64 // s.now() at arrival
	client  netip.AddrPort
	ev      RoutedEvent
	// holds: the slot holds ex slept through; holdEnd and hold: how the
	// last one ended and its advice (holdSlot; the access log).
	holds   int32
	holdEnd heldWake
	hold    affinity.HoldAdvice

	// streaming state
	uresp     *fasthttp.Response
	up        upConn // the stream's upstream connection (see upstream.go)
	streamEOF bool   // the upstream stream was read to its end
	stream    io.Reader
	idle      *idleConn // the stream's upstream connection; released at the first token
	gotFirst  bool      // FirstToken was called
	output    bool      // an SSE event with output was seen (see rolePreamble)
	closed    bool
	upErr     error
	line      []byte
	lineDrop  bool
	cached    int              // usage.prompt_tokens_details.cached_tokens (or timings.cache_n); -1 unknown
	timings   affinity.Outcome // the engine's own prefill/decode timings (llama.cpp), when reported
	status    int
	firstAt   int64 // s.now() at the first token; 0 = none
	promptRep int   // usage.prompt_tokens; -1 = not reported
	outTok    int   // usage.completion_tokens; -1 = not reported
	fjParser  fastjson.Parser
	ten       tenantState // tenants.go
	rl        relay       // the stream's upstream decoder and write buffer (stream.go)
}

func (s *Server) getExchange() *exchange {
	var ex *exchange
	select {
	case ex = <-s.exFree:
	default:
		ex = s.newExchange()
	}
	ex.cached = -1
	ex.ten.reset()
	ex.firstAt, ex.promptRep, ex.outTok = 0, -1, -1
	ex.holds = 0
	ex.timings = affinity.Outcome{}
	ex.closed = false
	ex.gotFirst = false
	ex.output = false
	ex.upErr, ex.errSent = nil, 0
	ex.streamEOF = false
	ex.line = ex.line[:0]
	ex.lineDrop = false
	ex.rep = nil
	ex.stream = nil
	ex.uresp = nil
	ex.idle = nil
	ex.api.reset()
	return ex
}

func (s *Server) putExchange(ex *exchange) {
	ex.holdUnlock()      // no path should leave it held; never pool it held
	s.tenantEnd(ex)      // every path out returns the tenant's charge
	ex.up.release(false) // no-op unless a path forgot it: never pool a held connection
	ex.rep = nil
	ex.mm = nil
	ex.stream = nil
	ex.uresp = nil
	ex.idle = nil
	ex.upErr, ex.errSent = nil, 0
	ex.req.Model = nil
	ex.req.Hashes = nil
	if cap(ex.prompt.Canonical) > maxPooledPrompt || cap(ex.salted) > maxPooledPrompt {
		return // a huge prompt grew this parser's scratch: let it go
	}
	select {
	case s.exFree <- ex:
	default: // free list full: garbage
	}
}
