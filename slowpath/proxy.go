package slowpath

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/tenant"
	"github.com/zeebo/xxh3"
)

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
	strDone         = []byte("[DONE]")
	strCachedTokens = []byte(`"cached_tokens"`)
	strTimings      = []byte(`"timings"`)
	strRole         = []byte(`"role"`)
	strContent      = []byte(`"content"`)
	strAppJSON      = []byte("application/json")
)

var (
	errStreamTooLong  = errors.New("sse line longer than the scan buffer")
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
	s       *Server
	parser  promptParser
	prompt  affinity.Prompt
	req     affinity.Request
	dec     affinity.Decision
	flight  affinity.Flight
	ep      endpoint
	api     apiState // Responses pinning and pass-through state (responses.go)

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
	sseParsed bool
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

// handle is the fasthttp handler, installed once as a method value.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer s.recoverPanic(ctx)
	if s.cors != nil && s.cors.preflight(ctx) {
		return
	}
	if bareLF(ctx.Request.Header.RawHeaders()) {
		// fasthttp ends a header line at a bare LF; a proxy or engine that
		// does not would read two headers as one (or the other way round).
		s.reject(ctx, fasthttp.StatusBadRequest, "malformed_http", "Malformed HTTP request: a header line ends in a bare LF.", errTypeInvalid, "", "")
		ctx.SetConnectionClose() // after reject, which resets the response
		return
	}
	if s.ten != nil && string(ctx.Path()) != "/health" && s.authenticate(ctx) == nil {
		if s.cors != nil {
			s.cors.decorate(ctx) // a browser client reads the 401
		}
		return // tenants.go: every API path needs a key
	}
	switch string(ctx.Path()) {
	case "/v1/chat/completions":
		s.route(ctx, epChat)
	case "/v1/completions":
		s.route(ctx, epCompletion)
	case "/v1/embeddings":
		s.route(ctx, epEmbedding)
	case "/v1/models":
		s.models(ctx)
	case "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentTypeBytes(strAppJSON)
		ctx.SetBodyString(`{"status":"ok"}`)
	default:
		if !s.handleAPI(ctx) { // responses.go, passthrough.go, models.go
			s.reject(ctx, fasthttp.StatusNotFound, "unknown_path", "Invalid URL ("+string(ctx.Method())+" "+string(ctx.Path())+")", errTypeInvalid, "", "unknown_url")
		}
	}
	if s.cors != nil {
		s.cors.decorate(ctx)
	}
}

// bareLF reports whether a raw header block has a line feed without the
// carriage return before it.
func bareLF(raw []byte) bool {
	for i := bytes.IndexByte(raw, '\n'); i >= 0; {
		if i == 0 || raw[i-1] != '\r' {
			return true
		}
		j := bytes.IndexByte(raw[i+1:], '\n')
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
}

// expect answers `Expect: 100-continue` (fasthttp's ExpectHandler): a
// declared body over limits.max_body_bytes is refused with the 413 before
// the client sends it, instead of a 100 Continue first.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	if cl := ctx.Request.Header.ContentLength(); cl > s.cfg.Limits.MaxBodyBytes {
		s.reject(ctx, fasthttp.StatusRequestEntityTooLarge, "too_large",
			fmt.Sprintf("Request body exceeds the limit of %d bytes.", s.cfg.Limits.MaxBodyBytes), errTypeInvalid, "", "request_too_large")
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}

// recoverPanic keeps one bad request from taking the process down. A panic
// mid-exchange leaks that exchange's slots; it is a bug, logged loudly.
func (s *Server) recoverPanic(ctx *fasthttp.RequestCtx) {
	if v := recover(); v != nil {
		s.log.Error("panic in handler", "panic", v, "path", string(ctx.Path()))
		s.reject(ctx, fasthttp.StatusInternalServerError, "panic", "Internal router error.", "internal_error", "", "")
	}
}

// reject answers from the router itself and counts it. A 429 or 503
// carries Retry-After: 1 (the limits it reports clear in about a second:
// a slot frees, a replica is re-admitted at its next probe).
func (s *Server) reject(ctx *fasthttp.RequestCtx, status int, reason, msg, typ, param, code string) {
	writeError(ctx, status, msg, typ, param, code)
	if status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable {
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, strOne)
	}
	s.m.localRequest(status)
	s.m.rejected.WithLabelValues(reason).Inc()
	if a := s.ops.access; a != nil {
		a.local(ctx, status, code)
	}
}

func isJSONContentType(ct []byte) bool {
	if len(ct) == 0 {
		return true // lenient: clients that send no Content-Type at all
	}
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	return bytes.EqualFold(ct, strAppJSON) || isPlusJSON(ct)
}

func (s *Server) route(ctx *fasthttp.RequestCtx, ep endpoint) {
	if !ctx.IsPost() {
		s.reject(ctx, fasthttp.StatusMethodNotAllowed, "method", "Method "+string(ctx.Method())+" not allowed for "+string(ctx.Path())+"; use POST", errTypeInvalid, "", "method_not_allowed")
		ctx.Response.Header.SetBytesKV(hdrAllow, strPOST) // after reject: writeError resets the response
		return
	}
	if ep == epPassMulti {
		if !isMultipart(ctx.Request.Header.ContentType()) {
			s.reject(ctx, fasthttp.StatusBadRequest, "content_type", "Content-Type must be multipart/form-data, got "+string(ctx.Request.Header.ContentType()), errTypeInvalid, "", "")
			return
		}
	} else if !isJSONContentType(ctx.Request.Header.ContentType()) {
		s.reject(ctx, fasthttp.StatusBadRequest, "content_type", "Content-Type must be application/json (or application/*+json), got "+string(ctx.Request.Header.ContentType()), errTypeInvalid, "", "")
		return
	}
	var key *tenant.Key
	if s.ten != nil {
		if key = s.authenticate(ctx); key == nil {
			return
		}
	}
	body := ctx.PostBody()
	if len(body) == 0 {
		s.reject(ctx, fasthttp.StatusBadRequest, "empty_body", "We could not parse the JSON body of your request: the body is empty.", errTypeInvalid, "", "")
		return
	}
	ex := s.getExchange()
	ex.start = s.now()
	ex.ep = ep
	err := s.parse(ctx, ex, body)
	if err != nil {
		s.putExchange(ex)
		msg, param := badRequest(err)
		if d := describeJSON(body); d != "" && ep != epPassMulti {
			msg, param = "We could not parse the JSON body of your request: "+d, ""
		}
		s.reject(ctx, fasthttp.StatusBadRequest, "bad_json", msg, errTypeInvalid, param, "")
		return
	}
	if len(ex.prompt.Model) == 0 {
		s.putExchange(ex)
		s.reject(ctx, fasthttp.StatusBadRequest, "no_model", "you must provide a model parameter", errTypeInvalid, "model", "")
		return
	}
	if !s.tenantPrepare(ctx, ex, key) {
		s.putExchange(ex)
		return
	}
	if ex.ten.salt != nil && len(ex.prompt.CacheSalt) > 0 {
		s.putExchange(ex)
		s.reject(ctx, fasthttp.StatusBadRequest, "bad_json", "Invalid request: cache_salt is set by the router for this API key", errTypeInvalid, "cache_salt", "")
		return
	}
	if (s.cfg.Tenancy.SaltFrom != SaltFromNone || ex.ten.salt != nil) && len(ex.prompt.CacheSalt) == 0 && ep.saltable() {
		if b, ok := s.saltBody(ctx, ex, body); ok {
			body = b
			err = s.parse(ctx, ex, body)
			if err != nil || len(ex.prompt.CacheSalt) == 0 {
				s.putExchange(ex)
				s.reject(ctx, fasthttp.StatusBadRequest, "bad_json", "Invalid request: cache_salt must be a non-empty string", errTypeInvalid, "cache_salt", "")
				return
			}
		}
	}
	ex.model = append(ex.model[:0], ex.prompt.Model...)
	if !s.tenantAdmit(ctx, ex, ep) {
		s.putExchange(ex)
		return
	}
	if !s.admit(ex) {
		s.putExchange(ex)
		s.reject(ctx, fasthttp.StatusTooManyRequests, "total_limit", "The router is at its concurrency limit; retry later.", errTypeRateLimit, "", "rate_limit_exceeded")
		return
	}
	ex.req.Model = ex.model
	ex.req.Hashes = ex.prompt.Hashes
	ex.req.PromptTokens = ex.prompt.Tokens
	// A buffered answer's first byte is its last: it must not teach the
	// replica's TTFT model (the exchange is pooled, so always set).
	ex.req.Buffered = !ex.prompt.Stream
	ex.req.SessionKey = 0
	if sid := ctx.Request.Header.PeekBytes(s.sessionHeader); len(sid) > 0 {
		ex.req.SessionKey = xxh3.Hash(sid) | 1
	} else if len(ex.prompt.User) > 0 {
		ex.req.SessionKey = xxh3.Hash(ex.prompt.User) | 1
	}
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		ex.client = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	} else {
		ex.client = netip.AddrPort{}
	}
	s.forward(ctx, ex, body)
}

// saltBody returns body with `"cache_salt":"<hex>"` appended, the hex being
// the first 16 bytes of SHA-256 over the tenant key (the Authorization value
// or the tenant header; the key itself is never kept or logged). ok is false
// when the request names no tenant (it stays unsalted).
func (s *Server) saltBody(ctx *fasthttp.RequestCtx, ex *exchange, body []byte) ([]byte, bool) {
	var key []byte
	if ex.ten.salt != nil {
		key = ex.ten.salt // the API key's tenant (tenants.salt)
	} else if s.cfg.Tenancy.SaltFrom == SaltFromAPIKey {
		key = ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	} else {
		key = ctx.Request.Header.Peek(s.cfg.Tenancy.Header)
	}
	if len(key) == 0 {
		return nil, false
	}
	end := len(bytes.TrimRight(body, " \t\r\n")) - 1 // the object's closing '}'
	if end < 1 || body[end] != '}' {
		return nil, false
	}
	sum := sha256.Sum256(key)
	b := append(ex.salted[:0], body[:end]...)
	b = append(b, `,"cache_salt":"`...)
	b = hex.AppendEncode(b, sum[:16])
	b = append(b, `"}`...)
	ex.salted = b
	return b, true
}

// badRequest turns a parse error (affinity wraps ErrBadRequest and names the
// field first: "bad request: messages must be ...") into the client-facing
// message and the OpenAI `param`. Error path only.
func badRequest(err error) (msg, param string) {
	msg = err.Error()
	if rest, ok := strings.CutPrefix(msg, affinity.ErrBadRequest.Error()+": "); ok {
		msg = rest
		field, _, _ := strings.Cut(rest, " ")
		field, _, _ = strings.Cut(field, "[")
		if field != "body" {
			param = field
		}
	}
	if param == "" {
		return "We could not parse the JSON body of your request: " + msg, ""
	}
	return "Invalid request: " + msg, param
}

// admit takes a slot of the total concurrency limit, queueing if configured.
func (s *Server) admit(ex *exchange) bool {
	if s.tryTotal() {
		return true
	}
	if s.conf().Limits.OnLimit != OnLimitQueue {
		return false
	}
	deadline := s.epoch.Add(time.Duration(ex.start) + s.conf().Limits.QueueTimeout)
	for {
		c := s.freed.wait()
		if s.tryTotal() {
			s.freed.done()
			return true
		}
		if !s.freed.sleep(c, deadline) {
			return s.tryTotal()
		}
	}
}

func (s *Server) tryTotal() bool {
	limit := int64(s.conf().Limits.MaxInFlight)
	for {
		n := s.inflight.Load()
		if limit > 0 && n >= limit {
			return false
		}
		if s.inflight.CompareAndSwap(n, n+1) {
			s.m.inFlight.Inc()
			return true
		}
	}
}

func (s *Server) releaseTotal() {
	s.inflight.Add(-1)
	s.m.inFlight.Dec()
	s.freed.signal()
}

// decide ranks replicas; with on_limit=queue it waits for capacity when
// every candidate is at its limit.
func (s *Server) decide(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	if s.fq != nil {
		return s.decideFair(ctx, ex) // queue.go
	}
	queue := s.conf().Limits.OnLimit == OnLimitQueue
	deadline := s.epoch.Add(time.Duration(ex.start) + s.conf().Limits.QueueTimeout)
	for {
		var c chan struct{}
		if queue {
			c = s.freed.wait() // before Decide: a release in between wakes us
		}
		t0 := s.now()
		ex.req.Now = t0
		err := s.brain.Decide(&ex.req, &ex.dec)
		ex.decided = s.now()
		s.m.decision.Observe(seconds(ex.decided - t0))
		if err == nil && len(ex.dec.Ranked) > 0 {
			if queue {
				s.freed.done()
			}
			return true
		}
		full := err == nil || errors.Is(err, affinity.ErrNoReplica)
		if full && queue && s.anyFull(ex.model) {
			if s.freed.sleep(c, deadline) {
				continue
			}
		} else if queue {
			s.freed.done()
		}
		s.rejectUndecided(ctx, ex, err, full)
		return false
	}
}

// rejectUndecided answers a request no replica was ranked for: err is
// Decide's, full whether it found none eligible (rather than failing).
func (s *Server) rejectUndecided(ctx *fasthttp.RequestCtx, ex *exchange, err error, full bool) {
	switch {
	case errors.Is(err, affinity.ErrModelNotFound):
		s.reject(ctx, fasthttp.StatusNotFound, "model_not_found", "The model `"+string(ex.model)+"` does not exist or you do not have access to it.", errTypeInvalid, "model", "model_not_found")
	case full && s.anyFull(ex.model):
		s.reject(ctx, fasthttp.StatusTooManyRequests, "replica_limit", "Every replica serving model `"+string(ex.model)+"` is at its concurrency limit; retry later.", errTypeRateLimit, "", "rate_limit_exceeded")
	case full:
		s.reject(ctx, fasthttp.StatusServiceUnavailable, "no_replica", "No healthy replica serves model `"+string(ex.model)+"` right now.", errTypeUnavailable, "model", "no_replica_available")
	default:
		msg, param := badRequest(err)
		s.reject(ctx, fasthttp.StatusBadRequest, "bad_request", msg, errTypeInvalid, param, "")
	}
}

// anyFull reports whether a healthy replica serving model is at its limit
// (429) as opposed to none being healthy (503). Error path only.
func (s *Server) anyFull(model []byte) bool {
	for _, r := range *s.table.Load() {
		if r != nil && r.serves(model) && r.isHealthy() && r.full() {
			return true
		}
	}
	return false
}

// forward proxies to the best ranked replica, retrying down the ranking
// while nothing has been written to the client.
func (s *Server) forward(ctx *fasthttp.RequestCtx, ex *exchange, body []byte) {
	if !s.rank(ctx, ex) { // decide, or the pinned / fixed replica (responses.go)
		s.releaseTotal()
		s.putExchange(ex)
		return
	}
	ureq := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(ureq)
	s.buildUpstream(ctx, ureq, body, ex)

ranked:
	table := *s.table.Load()
	attempts := 0
	var lastErr error
	lastStatus := 0
	for i, id := range ex.dec.Ranked {
		if attempts >= s.conf().Upstream.MaxAttempts {
			break
		}
		if int(id) < 0 || int(id) >= len(table) {
			continue
		}
		r := table[id]
		if r == nil || r.removed.Load() || !r.tryAcquire() {
			continue
		}
		attempts++
		pred := 0
		if i < len(ex.dec.CachedTokens) {
			pred = ex.dec.CachedTokens[i]
		}
		if attempts > 1 {
			ex.decided = s.now()
		}
		ex.req.Now = ex.decided
		ex.flight = affinity.Flight{}
		s.brain.Begin(id, &ex.req, &ex.dec, &ex.flight)
		s.guardStarted(ex, r) // the fair queue's prefill guard (queueguard.go)
		uresp := fasthttp.AcquireResponse()
		uresp.StreamBody = ex.prompt.Stream
		ureq.Header.SetHost(r.name)
		s.setEngineAuth(ctx, &ureq.Header, r)
		started, err := s.attempt(ctx, ex, r, ureq, uresp)
		status := uresp.StatusCode()
		last := attempts >= s.conf().Upstream.MaxAttempts || i == len(ex.dec.Ranked)-1
		switch {
		case err == nil, !started && !errors.Is(err, errClientGone) && !errors.Is(err, fasthttp.ErrTimeout):
			// Answered, or failed where the engine cannot have begun the
			// work (connect error, reset before any byte): retryable below.
		case errors.Is(err, errClientGone):
			// Nobody to answer: the upstream connection is closed (the
			// engine cancels), the replica did nothing wrong.
			s.endAttempt(ex, r, uresp)
			r.m.clientGone.Inc()
			r.log.Debug("client left before the answer began; upstream request cancelled")
			s.reject(ctx, statusClientClosed, "client_gone", "Client closed the request.", errTypeInvalid, "", "")
			ctx.SetConnectionClose()
			return
		case errors.Is(err, fasthttp.ErrBodyTooLarge):
			// The engine did the work: another replica would do it again
			// and answer as much. Not the replica's fault either.
			s.endAttempt(ex, r, uresp)
			r.log.Warn("engine answer over limits.max_response_bytes", "limit", s.conf().Limits.MaxResponseBytes)
			s.reject(ctx, fasthttp.StatusBadGateway, "response_too_large",
				fmt.Sprintf("The engine's answer exceeds the router's limit of %d bytes.", s.conf().Limits.MaxResponseBytes),
				errTypeUpstream, "", "response_too_large")
			return
		case errors.Is(err, fasthttp.ErrTimeout):
			// upstream.response_timeout: a long generation looks like this
			// too. Not retried (another replica would start it over) and
			// not held against a replica that answers its health checks.
			s.endAttempt(ex, r, uresp)
			r.m.timeouts.Inc()
			r.log.Warn("upstream response timeout", "timeout", s.conf().Upstream.ResponseTimeout, "started", started)
			s.reject(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout",
				"The upstream replica did not answer within the router's response timeout.", errTypeUpstream, "", "upstream_timeout")
			return
		default:
			// The answer began and broke (reset, malformed, stalled past
			// upstream.idle_timeout): the engine had the request, so it is
			// not sent again, but a broken answer counts against the replica.
			s.endAttempt(ex, r, uresp)
			s.proxyFailed(r, err)
			r.log.Warn("upstream answer broke before reaching the client", "err", err)
			s.reject(ctx, fasthttp.StatusBadGateway, "upstream_failed", msgUpstreamFailed, errTypeUpstream, "", "upstream_error")
			return
		}
		badStatus := err == nil && s.retryStatus(status)
		if badStatus && !last {
			err = errRetryStatus
		}
		if err != nil {
			// Nothing reached the client: try the next ranked replica.
			uresp.CloseBodyStream() //nolint:errcheck // discarding
			ex.up.release(false)    // a retried status's stream: not drained
			fasthttp.ReleaseResponse(uresp)
			s.brain.End(&ex.flight, s.now(), -1, false)
			r.release()
			s.freed.signal()
			r.m.retries.Inc()
			if !errors.Is(err, fasthttp.ErrNoFreeConns) {
				s.proxyFailed(r, err) // our own pool being full says nothing about the replica
			}
			lastErr, lastStatus = err, status
			r.log.Debug("attempt failed", "err", err, "status", status)
			continue
		}
		streamed := ex.prompt.Stream && uresp.BodyStream() != nil
		switch {
		case badStatus:
			// Last chance: pass the engine's answer on, but count it.
			s.proxyFailed(r, errRetryStatus)
		case !streamed:
			r.proxyOK()
		}
		// A stream counts as a success for passive ejection only when it
		// ends well (CloseWithError): headers alone would reset the failure
		// count that a replica breaking every stream mid-way keeps raising.
		ex.rep = r
		ex.pred = pred
		ex.mm = r.modelMetrics(ex.model)
		ex.status = status
		if bs := uresp.BodyStream(); ex.prompt.Stream && bs != nil {
			s.startStream(ctx, ex, uresp, bs)
			return // exchange finishes in CloseWithError
		}
		s.finishBuffered(ctx, ex, uresp)
		return
	}
	if attempts == 0 && s.fq != nil {
		// Ranked, but each slot went to another request in between: back
		// to the fair queue (decideFair answers when it gives up).
		ex.ten.front = true
		if s.decide(ctx, ex) {
			goto ranked
		}
		s.releaseTotal()
		s.putExchange(ex)
		return
	}
	// Every attempt failed before the first byte.
	s.releaseTotal()
	s.putExchange(ex)
	if lastErr == nil {
		s.reject(ctx, fasthttp.StatusServiceUnavailable, "no_replica", "No replica serving model `"+string(ex.model)+"` could take the request.", errTypeUnavailable, "model", "no_replica_available")
		return
	}
	code := fasthttp.StatusBadGateway
	if errors.Is(lastErr, errRetryStatus) && lastStatus > 0 {
		code = lastStatus
	}
	s.log.Warn("every attempt failed", "model", string(ex.model), "attempts", attempts, "err", lastErr)
	msg := msgUpstreamFailed
	if attempts > 1 {
		msg = "The upstream replicas failed to answer."
	}
	s.reject(ctx, code, "upstream_failed", msg, errTypeUpstream, "", "upstream_error")
}

var errRetryStatus = errors.New("replica answered with a retryable status")

// msgUpstreamFailed is the client's message for a 502; the detail (socket
// addresses, fasthttp's text) stays in the log.
const msgUpstreamFailed = "The upstream replica failed to answer."

// endAttempt undoes an attempt that ends the request without an answer
// from the engine: the flight, both slots and the exchange.
func (s *Server) endAttempt(ex *exchange, r *replica, uresp *fasthttp.Response) {
	uresp.CloseBodyStream() //nolint:errcheck // discarding
	ex.up.release(false)
	fasthttp.ReleaseResponse(uresp)
	s.brain.End(&ex.flight, s.now(), -1, false)
	r.release()
	s.freed.signal()
	s.releaseTotal()
	s.putExchange(ex)
}

// statusClientClosed is what a request whose client left before its answer
// began is counted as (nginx's 499; nobody receives it).
const statusClientClosed = 499

func (s *Server) retryStatus(st int) bool {
	for _, x := range s.conf().Upstream.RetryStatuses {
		if x == st {
			return true
		}
	}
	return false
}

// buildUpstream copies the client request: same method, URI, headers
// (Authorization included) and body bytes; hop-by-hop headers dropped,
// Accept-Encoding dropped so the usage chunk stays readable, X-Forwarded-For
// appended.
func (s *Server) buildUpstream(ctx *fasthttp.RequestCtx, ureq *fasthttp.Request, body []byte, ex *exchange) {
	ctx.Request.Header.CopyTo(&ureq.Header)
	// Always the origin form (path?query): an absolute-form request line
	// (`POST http://elsewhere/...`) must not carry the client's authority to
	// the replica, which would take it as Host.
	ureq.SetRequestURIBytes(ctx.URI().RequestURI())
	ureq.URI().DisablePathNormalizing = true
	ureq.UseHostHeader = true // each attempt's Host is its replica (SetHost), not the URI's
	ureq.Header.DisableNormalizing()
	h := &ureq.Header
	delNominated(h, ctx.Request.Header.PeekAll(fasthttp.HeaderConnection))
	h.DelBytes(hdrConnection)
	h.DelBytes(hdrKeepAlive)
	h.DelBytes(hdrProxyConnection)
	h.DelBytes(hdrTE)
	h.DelBytes(hdrTrailer)
	h.DelBytes(hdrTransferEnc)
	h.DelBytes(hdrUpgrade)
	h.DelBytes(hdrAcceptEncoding)
	h.DelBytes(hdrExpect) // the router already read the body
	if ex.ten.key != nil && !s.cfg.Tenants.ForwardKey {
		h.Del(fasthttp.HeaderAuthorization) // tenants' keys stay at the router
	}
	// Forwarding headers: believed only from trusted_proxies; from anyone
	// else replaced by what the router saw (every line of them: a second
	// X-Forwarded-For line would otherwise survive the one set here).
	trusted := ex.client.IsValid() && s.trustedPeer(ex.client.Addr())
	if !trusted {
		h.DelBytes(hdrXRealIP)
		h.DelBytes(hdrForwarded)
	}
	h.DelBytes(hdrXForwardedFor)
	if ex.client.IsValid() {
		b := ex.scratch[:0]
		if trusted {
			for _, v := range ctx.Request.Header.PeekAll(fasthttp.HeaderXForwardedFor) {
				b = append(append(b, v...), ", "...)
			}
		}
		n := len(b)
		b = ex.client.Addr().AppendTo(b)
		ex.scratch = b
		h.SetBytesKV(hdrXForwardedFor, b)
		if !trusted {
			h.SetBytesKV(hdrXRealIP, b[n:])
		}
	}
	ureq.SetBodyRaw(body)
}

// delNominated deletes the headers a Connection header names (RFC 9110
// 7.6.1: they are hop-by-hop too), e.g. `Connection: close, X-Secret`.
func delNominated(h interface{ DelBytes([]byte) }, conn [][]byte) {
	for _, v := range conn {
		for len(v) > 0 {
			var tok []byte
			if i := bytes.IndexByte(v, ','); i >= 0 {
				tok, v = v[:i], v[i+1:]
			} else {
				tok, v = v, nil
			}
			if tok = bytes.TrimSpace(tok); len(tok) > 0 {
				h.DelBytes(tok)
			}
		}
	}
}

// trustedPeer reports whether a is in trusted_proxies.
func (s *Server) trustedPeer(a netip.Addr) bool {
	for _, p := range s.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// copyResponseHeader copies upstream response headers minus hop-by-hop ones.
func copyResponseHeader(dst *fasthttp.ResponseHeader, src *fasthttp.ResponseHeader) {
	src.CopyTo(dst)
	delNominated(dst, src.PeekAll(fasthttp.HeaderConnection))
	dst.DelBytes(hdrConnection)
	dst.DelBytes(hdrKeepAlive)
	dst.DelBytes(hdrTransferEnc)
	dst.DelBytes(hdrTrailer)
	dst.DelBytes(hdrUpgrade)
}

// finishBuffered answers a non-streaming request from the full upstream body.
func (s *Server) finishBuffered(ctx *fasthttp.RequestCtx, ex *exchange, uresp *fasthttp.Response) {
	body := uresp.Body()
	now := s.now()
	if ex.status == fasthttp.StatusOK {
		ex.cached = usageJSON(&ex.fjParser, body, &ex.timings)
		if ex.ep == epResponses {
			s.responseAnswered(ex, body)
		}
		ex.promptRep, ex.outTok = usageTokens(&ex.fjParser, body)
		ex.tenantCharge()
	}
	copyResponseHeader(&ctx.Response.Header, &uresp.Header)
	// Hand the buffer over instead of copying it: a large answer is held
	// once. ctx's previous buffer goes back to uresp's pool.
	uresp.SwapBody(ctx.Response.SwapBody(uresp.SwapBody(nil)))
	fasthttp.ReleaseResponse(uresp)
	s.brain.FirstToken(&ex.flight, now)
	ex.mm.ttft.Observe(seconds(now - ex.start))
	ex.firstAt = now
	s.completeAt(ex, true, nil, now)
}

// seconds converts a s.now() difference for histograms.
func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// completeAt does the bookkeeping shared by buffered and streamed answers.
func (s *Server) completeAt(ex *exchange, ok bool, werr error, now int64) {
	r := ex.rep
	o := ex.timings
	o.OK, o.CachedTokens = ok && ex.status < 500 && !ex.api.noWork, ex.cached
	s.brain.EndWith(&ex.flight, now, o)
	ex.mm.request(ex.status) // a stream broken later also counts in broken_streams_total
	ex.mm.e2e.Observe(seconds(now - ex.start))
	if ex.cached >= 0 {
		// Both only for requests that reported usage: the two are comparable.
		r.m.predicted.Add(float64(ex.pred))
		r.m.actual.Add(float64(ex.cached))
		d := ex.cached - ex.pred
		if d < 0 {
			d = -d
		}
		s.m.predictionErr.Observe(float64(d))
	}
	s.countTokens(ex, now)
	if obs, acc := s.Observer, s.ops.access; obs != nil || acc != nil {
		ex.ev = RoutedEvent{
			Client:                ex.client,
			Model:                 ex.model,
			Replica:               r.name,
			ReplicaID:             r.id,
			Hashes:                ex.req.Hashes,
			SessionKey:            ex.req.SessionKey,
			PromptTokens:          ex.req.PromptTokens,
			PredictedCachedTokens: ex.pred,
			CachedTokens:          ex.cached,
			Status:                ex.status,
			OK:                    ok && werr == nil,
			Start:                 ex.decided,
			End:                   now,
			Arrival:               ex.start,
			FirstToken:            ex.firstAt,
			ReportedPromptTokens:  ex.promptRep,
			OutputTokens:          ex.outTok,
		}
		if obs != nil {
			obs.ObserveRouted(&ex.ev)
		}
		if acc != nil {
			acc.routed(&ex.ev)
		}
	}
	r.release()
	s.releaseTotal()
	s.putExchange(ex)
}

// usageScanFrom: bodies longer than this are not parsed whole for their
// usage: only their last "usage" and "timings" objects are (engines put
// them last, after the generated text, which is most of a large answer).
const usageScanFrom = 4 << 10

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
	depth, inStr := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}
