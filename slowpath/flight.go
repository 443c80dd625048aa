package slowpath

import (
	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
)

// The exchange's flight: the only place the proxy tells affinity that an
// attempt began on a replica, produced its first token and ended. affinity
// keeps the replica's in-flight load, pending prefill and speculative index
// entries from these three calls; each attempt that begins ends once.

// beginFlight starts the attempt on replica id at ex.decided.
func (ex *exchange) beginFlight(id affinity.ReplicaID) {
	ex.req.Now = ex.decided
	ex.flight = affinity.Flight{}
	ex.s.brain.Begin(id, &ex.req, &ex.dec, &ex.flight)
}

// firstToken marks the exchange's first token at now: the replica's
// prefill ends and the TTFT histogram gets its sample.
func (ex *exchange) firstToken(now int64) {
	ex.gotFirst = true
	ex.firstAt = now
	ex.s.brain.FirstToken(&ex.flight, now)
	ex.mm.ttft.Observe(seconds(now - ex.start))
}

// endFlight ends the attempt with what the engine reported.
func (ex *exchange) endFlight(now int64, o affinity.Outcome) {
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
