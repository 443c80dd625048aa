package slowpath

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
)

// Forwarding: rank the replicas (decide), try them in order while nothing
// has reached the client, then answer buffered (finishBuffered) or hand the
// stream to the relay (stream.go); completeAt does the shared bookkeeping.

// decide ranks replicas; with on_limit=queue it waits for capacity when
// every candidate is at its limit.
func (s *Server) decide(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	if s.fq != nil {
		return s.decideFair(ctx, ex) // queue.go
	}
	queue := s.conf().Limits.OnLimit == OnLimitQueue
	deadline := s.epoch.Add(time.Duration(ex.start) + s.conf().Limits.QueueTimeout)
	var held affinity.HoldAdvice
	raced := 0
	for {
		var c chan struct{}
		if queue {
			c = s.freed.wait() // before Decide: a release in between wakes us
		}
		err := ex.decide()
		if err == nil && len(ex.dec.Ranked) > 0 {
			if queue {
				s.freed.done()
			}
			if ex.dec.Hold.Holding() {
				if s.holdSlot(ctx, ex, &held) {
					s.reject(ctx, apiClientGone, "Client closed the request.", "")
					ctx.SetConnectionClose()
					return false
				}
				continue
			}
			if ex.req.HoldSince != 0 {
				s.m.holdTime.Observe(seconds(ex.held()))
			}
			return true
		}
		full := err == nil || errors.Is(err, affinity.ErrNoReplica)
		if full && queue && s.anyFull(ex.model) {
			ex.holdUnlock()
			if s.freed.sleep(c, deadline) {
				continue
			}
		} else {
			if queue {
				s.freed.done()
			}
			// Decide found none eligible, yet one is now: a slot freed
			// between the two looks. Decide again rather than answer 429
			// or that no replica is healthy (bounded: a policy that ranks
			// nothing among eligible replicas must not spin).
			if full && raced < 3 && s.anyEligible(ex.model) {
				raced++
				continue
			}
		}
		s.rejectUndecided(ctx, ex, err, full)
		return false
	}
}

// holdSlot follows the cost policy's advice to wait for a busy batch slot
// that holds ex's prompt (affinity.HoldAdvice): it counts the request as
// held on the slot's replica and sleeps until a request ends (the freed
// gate: the slot may have freed) or the advice's Until; ex then decides
// again. held is the advice being followed: advice for the same slot and
// request in it keeps its first Until. A wait that reaches Until without
// a release sets NoHold: the prediction was wrong, and the request is
// routed as if holds were off. A woken request decides and begins
// holding s.holdMu (ex.holdLocked, released once it began or was held
// again): requests woken together would otherwise all see the freed slot
// and all begin there, the engine queueing all but one behind it. gone:
// the client left while held (checked as the tenant queue does): nothing
// was sent, the caller answers 499.
func (s *Server) holdSlot(ctx *fasthttp.RequestCtx, ex *exchange, held *affinity.HoldAdvice) (gone bool) {
	ex.holdUnlock()
	h := ex.dec.Hold
	h.Continues(*held)
	*held = h
	now := s.now()
	if h.Until <= now {
		ex.req.NoHold = true
		s.m.holds.WithLabelValues("expired").Inc()
		return false
	}
	c := s.freed.wait()
	// A request that ended between the decision and wait did not wake
	// us: decide again, now registered, and sleep only if a hold is still
	// advised (the one it advises now).
	if err := ex.decide(); err != nil || len(ex.dec.Ranked) == 0 || !ex.dec.Hold.Holding() {
		s.freed.done()
		return false
	}
	if n := ex.dec.Hold; !h.Continues(n) {
		h = n
	}
	*held = h
	ex.req.Hold(h, now)
	s.brain.Hold(h, 1)
	w := s.sleepHeld(ctx, c, h.Until)
	s.brain.Hold(h, -1)
	ex.holds++
	ex.holdEnd, ex.hold = w, h
	s.m.holds.WithLabelValues(w.String()).Inc()
	switch w {
	case heldGone:
		return true
	case heldExpired:
		ex.req.NoHold = true
	}
	s.holdMu.Lock()
	ex.holdLocked = true
	return false
}

// heldWake is how a slot hold's sleep ended (sleepHeld).
type heldWake int8

const (
	heldWoken   heldWake = iota // a request ended
	heldExpired                 // the advice's Until passed
	heldGone                    // the client left
)

func (w heldWake) String() string { return [...]string{"woken", "expired", "client_gone"}[w] }

// sleepHeld is gate.sleep for a held request (c from s.freed.wait) until
// until (s.now's clock), checking every queueClientCheck that its client
// is still there.
func (s *Server) sleepHeld(ctx *fasthttp.RequestCtx, c chan struct{}, until int64) heldWake {
	defer s.freed.done()
	t := time.NewTimer(time.Duration(max(until-s.now(), 0)))
	defer t.Stop()
	tick := time.NewTicker(queueClientCheck)
	defer tick.Stop()
	for {
		select {
		case <-c:
			return heldWoken
		case <-t.C:
			return heldExpired
		case <-tick.C:
			if clientGone(ctx.Conn()) {
				return heldGone
			}
		}
	}
}

// held is how long ex waited at the router for busy slots (holdSlot),
// until its last decision; 0 if it never did.
func (ex *exchange) held() int64 {
	if ex.req.HoldSince == 0 {
		return 0
	}
	return max(ex.decided-ex.req.HoldSince, 0)
}

// holdUnlock releases s.holdMu if ex holds it (holdSlot).
func (ex *exchange) holdUnlock() {
	if ex.holdLocked {
		ex.holdLocked = false
		ex.s.holdMu.Unlock()
	}
}

// rejectUndecided answers a request no replica was ranked for: err is
// Decide's, full whether it found none eligible (rather than failing).
func (s *Server) rejectUndecided(ctx *fasthttp.RequestCtx, ex *exchange, err error, full bool) {
	ex.holdUnlock()
	switch {
	case errors.Is(err, affinity.ErrModelNotFound):
		s.reject(ctx, apiModelNotFound, "The model `"+string(ex.model)+"` does not exist or you do not have access to it.", "model")
	case full && s.anyFull(ex.model):
		s.reject(ctx, apiReplicaLimit, "Every replica serving model `"+string(ex.model)+"` is at its concurrency limit; retry later.", "")
	case full:
		s.reject(ctx, apiNoReplica, "No healthy replica serves model `"+string(ex.model)+"` right now.", "model")
	default:
		msg, param := badRequest(err)
		s.reject(ctx, apiBadRequest, msg, param)
	}
}

// anyFull reports whether a healthy replica serving model is at its limit
// (429) as opposed to none being healthy (503). Error path only.
func (s *Server) anyFull(model []byte) bool {
	return s.anyServing(model, func(r *replica) bool { return r.isHealthy() && r.full() })
}

// anyEligible reports whether a replica serving model may be ranked now
// (healthy, not draining, below its limit). Error path only.
func (s *Server) anyEligible(model []byte) bool {
	return s.anyServing(model, func(r *replica) bool { return !r.removed.Load() && r.rt.Eligible(r.id) })
}

// anyServing reports whether a replica serving model satisfies ok.
func (s *Server) anyServing(model []byte, ok func(*replica) bool) bool {
	for _, r := range *s.table.Load() {
		if r != nil && r.serves(model) && ok(r) {
			return true
		}
	}
	return false
}

// forward proxies to the best ranked replica, retrying down the ranking
// while nothing has been written to the client.
func (s *Server) forward(ctx *fasthttp.RequestCtx, ex *exchange, body []byte) {
	if !s.rank(ctx, ex) { // decide, or the pinned / fixed replica (responses.go)
		ex.holdUnlock()
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
		began := r != nil && !r.removed.Load() && ex.takeSlot(r, attempts > 0)
		ex.holdUnlock() // a woken held request began, or tried the first ranked
		if !began {
			continue
		}
		s.guardStarted(ex, r) // the fair queue's prefill guard (queueguard.go)
		attempts++
		pred := 0
		if i < len(ex.dec.CachedTokens) {
			pred = ex.dec.CachedTokens[i]
		}
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
			s.reject(ctx, apiClientGone, "Client closed the request.", "")
			ctx.SetConnectionClose()
			return
		case errors.Is(err, fasthttp.ErrBodyTooLarge):
			// The engine did the work: another replica would do it again
			// and answer as much. Not the replica's fault either.
			s.endAttempt(ex, r, uresp)
			r.log.Warn("engine answer over limits.max_response_bytes", "limit", s.conf().Limits.MaxResponseBytes)
			s.reject(ctx, apiResponseTooLarge,
				fmt.Sprintf("The engine's answer exceeds the router's limit of %d bytes.", s.conf().Limits.MaxResponseBytes), "")
			return
		case errors.Is(err, fasthttp.ErrTimeout):
			// upstream.response_timeout: a long generation looks like this
			// too. Not retried (another replica would start it over) and
			// not held against a replica that answers its health checks.
			s.endAttempt(ex, r, uresp)
			r.m.timeouts.Inc()
			r.log.Warn("upstream response timeout", "timeout", s.conf().Upstream.ResponseTimeout, "started", started)
			s.reject(ctx, apiUpstreamTimeout,
				"The upstream replica did not answer within the router's response timeout.", "")
			return
		default:
			// The answer began and broke (reset, malformed, stalled past
			// upstream.idle_timeout): the engine had the request, so it is
			// not sent again, but a broken answer counts against the replica.
			s.endAttempt(ex, r, uresp)
			s.proxyFailed(r, err)
			r.log.Warn("upstream answer broke before reaching the client", "err", err)
			s.reject(ctx, apiUpstreamFailed, msgUpstreamFailed, "")
			return
		}
		badStatus := err == nil && s.retryStatus(status)
		if badStatus && !last {
			err = errRetryStatus
		}
		if err != nil {
			// Nothing reached the client: try the next ranked replica.
			s.dropAttempt(ex, r, uresp)
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
		s.reject(ctx, apiNoReplica, "No replica serving model `"+string(ex.model)+"` could take the request.", "model")
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
	s.reject(ctx, apiUpstreamFailed.withStatus(code), msg, "")
}

var errRetryStatus = errors.New("replica answered with a retryable status")

// msgUpstreamFailed is the client's message for a 502; the detail (socket
// addresses, fasthttp's text) stays in the log.
const msgUpstreamFailed = "The upstream replica failed to answer."

// endAttempt undoes an attempt that ends the request without an answer
// from the engine: the flight, both slots and the exchange.
func (s *Server) endAttempt(ex *exchange, r *replica, uresp *fasthttp.Response) {
	s.dropAttempt(ex, r, uresp)
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
	sent := sentHeaders(ctx.Request.Header.RawHeaders())
	del := func(i int) {
		if sent&(1<<i) != 0 {
			h.DelBytes(dropHeaders[i])
		}
	}
	if sent&(1<<dropConnection) != 0 {
		delNominated(h, ctx.Request.Header.PeekAll(fasthttp.HeaderConnection))
	}
	h.DelBytes(hdrConnection) // also fasthttp's connection-close flag
	for i := range dropForwardFirst {
		del(i) // hop-by-hop; Accept-Encoding; Expect (the router already read the body)
	}
	if ex.ten.key != nil && !s.cfg.Tenants.ForwardKey {
		h.Del(fasthttp.HeaderAuthorization) // tenants' keys stay at the router
	}
	// Forwarding headers: believed only from trusted_proxies; from anyone
	// else replaced by what the router saw (every line of them: a second
	// X-Forwarded-For line would otherwise survive the one set here).
	trusted := ex.client.IsValid() && s.trustedPeer(ex.client.Addr())
	if !trusted {
		del(dropXRealIP)
		del(dropForwarded)
	}
	del(dropXForwardedFor)
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

// dropHeaders are the request headers buildUpstream removes: the
// hop-by-hop ones and those it replaces. Indexes below dropForwardFirst
// always go.
var dropHeaders = [...][]byte{hdrKeepAlive, hdrProxyConnection, hdrTE, hdrTrailer, hdrTransferEnc, hdrUpgrade,
	hdrAcceptEncoding, hdrExpect, hdrXRealIP, hdrForwarded, hdrXForwardedFor, hdrConnection}

const (
	dropTrailer, dropTransferEnc                  = 3, 4
	dropForwardFirst                              = 8 // X-Real-Ip, Forwarded, X-Forwarded-For: by trust
	dropXRealIP, dropForwarded, dropXForwardedFor = 8, 9, 10
	dropConnection                                = 11
	dropAll                                       = 1<<len(dropHeaders) - 1
)

// sentHeaders returns which of dropHeaders (bit i for dropHeaders[i]) the
// client's raw header block names, so buildUpstream deletes only those
// (each DelBytes scans every header). Without a raw block, or with a
// chunked body (whose trailer fields are not in it), all of them.
func sentHeaders(raw []byte) uint16 {
	if len(raw) == 0 {
		return dropAll
	}
	var m uint16
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		k := bytes.IndexByte(line, ':')
		if k <= 0 {
			continue
		}
		key := bytes.TrimSpace(line[:k])
		for i, h := range dropHeaders {
			if len(key) == len(h) && bytes.EqualFold(key, h) {
				m |= 1 << i
			}
		}
	}
	if m&(1<<dropTrailer|1<<dropTransferEnc) != 0 {
		return dropAll
	}
	return m
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
		ex.cached, ex.promptRep, ex.outTok = usageBody(&ex.fjParser, body, &ex.timings)
		if ex.ep == epResponses {
			s.responseAnswered(ex, body)
		}
		ex.tenantCharge()
	}
	copyResponseHeader(&ctx.Response.Header, &uresp.Header)
	// Hand the buffer over instead of copying it: a large answer is held
	// once. ctx's previous buffer (the server keeps one per connection)
	// goes back to uresp's pool at its full length: the pool keeps only
	// buffers up to the size most of those put back had (bytebufferpool
	// calibrates by length), and empty ones would teach it to drop every
	// buffer an answer fits in, so each answer would allocate its body.
	prev := ctx.Response.SwapBody(uresp.SwapBody(nil))
	uresp.SwapBody(prev[:cap(prev)])
	fasthttp.ReleaseResponse(uresp)
	ex.firstToken(now)
	s.completeAt(ex, true, nil, now)
}

// seconds converts a s.now() difference for histograms.
func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// completeAt does the bookkeeping shared by buffered and streamed answers.
func (s *Server) completeAt(ex *exchange, ok bool, werr error, now int64) {
	r := ex.rep
	o := ex.timings
	o.OK, o.CachedTokens = ok && ex.status < 500 && !ex.api.noWork, ex.cached
	ex.endFlight(now, o)
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
			PredictedTTFT:         ex.flight.PredictedTTFT(),
			BusyAtStart:           ex.flight.BusyAtBegin(),
			CachedTokens:          ex.cached,
			Status:                ex.status,
			OK:                    ok && werr == nil,
			Start:                 ex.decided,
			End:                   now,
			Arrival:               ex.start,
			Held:                  ex.held(),
			Holds:                 int(ex.holds),
			FirstToken:            ex.firstAt,
			ReportedPromptTokens:  ex.promptRep,
			OutputTokens:          ex.outTok,
			EnginePrefillTokens:   o.PrefillTokens,
			EnginePrefillSeconds:  o.PrefillSeconds,
		}
		if ex.holds > 0 {
			ex.ev.HoldEnd, ex.ev.HoldPromised = ex.holdEnd.String(), ex.hold.Shared
			ex.ev.HoldWait, ex.ev.HoldGain = ex.hold.Wait, ex.hold.Gain
			if t, id := *s.table.Load(), ex.hold.Replica; int(id) >= 0 && int(id) < len(t) && t[id] != nil {
				ex.ev.HeldOn = t[id].name
			}
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
