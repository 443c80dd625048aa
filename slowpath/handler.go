package slowpath

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/tenant"
	"github.com/zeebo/xxh3"
)

// The request front: paths, method and content checks, the tenancy gate,
// parsing into the exchange, and the total concurrency limit. route hands a
// parsed, admitted request to forward (forward.go).

// handle is the fasthttp handler, installed once as a method value.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer s.recoverPanic(ctx)
	if s.cors != nil && s.cors.preflight(ctx) {
		return
	}
	if bareLF(ctx.Request.Header.RawHeaders()) {
		// fasthttp ends a header line at a bare LF; a proxy or engine that
		// does not would read two headers as one (or the other way round).
		s.reject(ctx, apiMalformedHTTP, "Malformed HTTP request: a header line ends in a bare LF.", "")
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
			s.reject(ctx, apiUnknownPath, "Invalid URL ("+string(ctx.Method())+" "+string(ctx.Path())+")", "")
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
		s.reject(ctx, apiTooLarge,
			fmt.Sprintf("Request body exceeds the limit of %d bytes.", s.cfg.Limits.MaxBodyBytes), "")
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}

// recoverPanic keeps one bad request from taking the process down. A panic
// mid-exchange leaks that exchange's slots; it is a bug, logged loudly.
func (s *Server) recoverPanic(ctx *fasthttp.RequestCtx) {
	if v := recover(); v != nil {
		s.log.Error("panic in handler", "panic", v, "path", string(ctx.Path()))
		s.reject(ctx, apiPanic, "Internal router error.", "")
	}
}

// reject answers from the router itself and counts it. A 429 or 503
// carries Retry-After: 1 (the limits it reports clear in about a second:
// a slot frees, a replica is re-admitted at its next probe).
func (s *Server) reject(ctx *fasthttp.RequestCtx, e apiError, msg, param string) {
	writeError(ctx, e.status, msg, e.typ, param, e.code)
	if e.status == fasthttp.StatusTooManyRequests || e.status == fasthttp.StatusServiceUnavailable {
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, strOne)
	}
	s.m.localRequest(e.status)
	s.m.rejected.WithLabelValues(e.reason).Inc()
	if a := s.ops.access; a != nil {
		a.local(ctx, e.status, e.code)
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
		s.reject(ctx, apiMethod, "Method "+string(ctx.Method())+" not allowed for "+string(ctx.Path())+"; use POST", "")
		ctx.Response.Header.SetBytesKV(hdrAllow, strPOST) // after reject: writeError resets the response
		return
	}
	if ep == epPassMulti {
		if !isMultipart(ctx.Request.Header.ContentType()) {
			s.reject(ctx, apiContentType, "Content-Type must be multipart/form-data, got "+string(ctx.Request.Header.ContentType()), "")
			return
		}
	} else if !isJSONContentType(ctx.Request.Header.ContentType()) {
		s.reject(ctx, apiContentType, "Content-Type must be application/json (or application/*+json), got "+string(ctx.Request.Header.ContentType()), "")
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
		s.reject(ctx, apiEmptyBody, "We could not parse the JSON body of your request: the body is empty.", "")
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
		s.reject(ctx, apiBadJSON, msg, param)
		return
	}
	if len(ex.prompt.Model) == 0 {
		s.putExchange(ex)
		s.reject(ctx, apiNoModel, "you must provide a model parameter", "model")
		return
	}
	if !s.tenantPrepare(ctx, ex, key) {
		s.putExchange(ex)
		return
	}
	if ex.ten.salt != nil && len(ex.prompt.CacheSalt) > 0 {
		s.putExchange(ex)
		s.reject(ctx, apiBadJSON, "Invalid request: cache_salt is set by the router for this API key", "cache_salt")
		return
	}
	if (s.cfg.Tenancy.SaltFrom != SaltFromNone || ex.ten.salt != nil) && len(ex.prompt.CacheSalt) == 0 && ep.saltable() {
		if b, ok := s.saltBody(ctx, ex, body); ok {
			body = b
			err = s.parse(ctx, ex, body)
			if err != nil || len(ex.prompt.CacheSalt) == 0 {
				s.putExchange(ex)
				s.reject(ctx, apiBadJSON, "Invalid request: cache_salt must be a non-empty string", "cache_salt")
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
		s.reject(ctx, apiTotalLimit, "The router is at its concurrency limit; retry later.", "")
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

// badRequest turns a parse error into the client-facing message and the
// OpenAI `param`: an affinity.FieldError names its field (none for the body
// as a whole); any other error is the body's. Error path only.
func badRequest(err error) (msg, param string) {
	var fe *affinity.FieldError
	if !errors.As(err, &fe) {
		return "We could not parse the JSON body of your request: " + err.Error(), ""
	}
	if fe.Field == "" {
		return "We could not parse the JSON body of your request: " + fe.Msg, ""
	}
	return "Invalid request: " + fe.Msg, fe.Field
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
