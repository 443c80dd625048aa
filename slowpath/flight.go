package slowpath

import (
	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
)

// The exchange's decision and flight: the only place the proxy asks
// affinity for a ranking and tells it that an attempt began on a replica,
// produced its first token and ended. affinity
// keeps the replica's in-flight load, pending prefill and speculative index
// entries from these three calls; each attempt that begins ends once.

// decide ranks the replicas for ex as of now (Router.Decide) and times the
// decision.
func (ex *exchange) decide() error {
	s := ex.s
	t0 := s.now()
	ex.req.Now = t0
	err := s.brain.Decide(&ex.req, &ex.dec)
	ex.decided = s.now()
	s.m.decision.Observe(seconds(ex.decided - t0))
	return err
}

// beginFlight takes one of r's in-flight slots and starts the attempt on
// it, at ex.decided for the first attempt and now for a retry: affinity
// checks r's in-flight limit and counts the request in one step
// (Router.TryBegin). false: r is at its limit, nothing began.
func (ex *exchange) beginFlight(r *replica, retry bool) bool {
	now := ex.decided
	if retry {
		now = ex.s.now()
	}
	ex.req.Now = now
	if !ex.s.brain.TryBegin(r.id, &ex.req, &ex.dec, &ex.flight) {
		return false
	}
	ex.decided = now
	r.m.inFlight.Inc()
	return true
}

// takeSlot starts ex's attempt on r: in the slot the prefill guard took
// for ex when it placed it (queueguard.go), or in a new one
// (beginFlight). A held slot elsewhere is given back first (a pinned
// ranking, a replica gone meanwhile): an exchange has one flight.
func (ex *exchange) takeSlot(r *replica, retry bool) bool {
	if h := ex.ten.held; h != nil {
		if h == r && !retry {
			ex.ten.held = nil
			return true
		}
		ex.s.fq.unhold(ex)
	}
	return ex.beginFlight(r, retry)
}

// firstToken marks the exchange's first token at now: the replica's
// prefill ends and the TTFT histogram gets its sample.
func (ex *exchange) firstToken(now int64) {
	ex.gotFirst = true
	ex.firstAt = now
	ex.s.brain.FirstToken(&ex.flight, now)
	ex.mm.ttft.Observe(seconds(now - ex.start))
	if ex.ten.pendOn != nil {
		ex.s.fq.prefilled(ex) // the prefill guard (queueguard.go)
	}
}

// endFlight ends the attempt with what the engine reported: o, and the
// prompt tokens of its usage, with which the router converts the engine's
// token counts into its own before comparing them with its predictions.
// A Responses request continuing a stored response gives none: the
// engine's count includes the history it holds, the router's estimate
// only the new input.
func (ex *exchange) endFlight(now int64, o affinity.Outcome) {
	if o.CachedTokens >= 0 && o.PromptTokens == 0 && ex.promptRep > 0 && len(ex.api.prevID) == 0 {
		o.PromptTokens = ex.promptRep
	}
	ex.s.brain.EndWith(&ex.flight, now, o)
}

// dropAttempt undoes an attempt the engine gave no answer to: the
// upstream response and connection, the flight (failed, cached tokens
// unknown) and the replica's slot. The total slot and the exchange stay.
func (s *Server) dropAttempt(ex *exchange, r *replica, uresp *fasthttp.Response) {
	uresp.CloseBodyStream() //nolint:errcheck // discarding
	ex.up.release(false)    // a retried status's stream: not drained
	fasthttp.ReleaseResponse(uresp)
	ex.endFlight(s.now(), affinity.Outcome{CachedTokens: -1})
	r.release()
	s.freed.signal()
}
