package affinity

import (
	"math"
	"sync/atomic"
)

// The engine's step phase. An engine runs its batch in steps (vLLM's
// scheduler, llama.cpp's server loop): a request that arrives while a step
// runs waits for that step to end before it is scheduled, however idle
// the engine otherwise is. Routers that pick the least loaded replica send
// a request, more often than chance, to the engine that has just ended a
// stream, which is where a step has just begun, so the wait they add is a
// whole step where chance would add half of one (one-company in the
// simulator: least-request 2.3-3.7x as many requests begun within 2 ms of a
// finish on their replica as round-robin, and a mean TTFT 1.05x
// round-robin's).
//
// A streamed answer shows where the steps end: each of its events is a
// step's output. stepClock keeps, per replica, the latest step end any of
// the router's streams there showed (Router.Token) and a step's length
// (the gap between one stream's events). The cost policy prices a
// candidate's wait for its running step against the average (half a step)
// already in its fitted overhead O_r: stepClock.phaseAdj.

// stepClock is a replica's step clock (repHot's line 3).
type stepClock struct {
	at atomic.Int64 // the latest step end seen (Request.Now clock), 0 = none
	// len packs two float32s: a step's length in seconds (low half; 0 =
	// unknown) and the mean absolute log deviation of the gaps from it
	// (high half), both EWMAs (sample). Packed so the clock fits the hot
	// record's last line; written with one CAS.
	len atomic.Uint64
}

// step returns the step length and its gaps' deviation.
func (c *stepClock) step() (sec, dev float64) {
	b := c.len.Load()
	return float64(math.Float32frombits(uint32(b))), float64(math.Float32frombits(uint32(b >> 32)))
}

// stepWeight is the EWMA weight of stepClock's step length and deviation:
// about the last twenty gaps.
const stepWeight = 0.05

// mark records a step end seen at now.
func (c *stepClock) mark(now int64) {
	for {
		a := c.at.Load()
		if a >= now || c.at.CompareAndSwap(a, now) {
			return
		}
	}
}

// sample takes one stream's gap between two events, in seconds. A gap
// under a quarter of the step is two events of one step read apart (or a
// stream's last events: usage, [DONE]) and is skipped; one over four steps
// (a stall, events coalesced by the network) counts as four steps.
func (c *stepClock) sample(g float64) {
	for {
		b := c.len.Load()
		s, d := float64(math.Float32frombits(uint32(b))), float64(math.Float32frombits(uint32(b>>32)))
		if s > 0 {
			if g < s/4 {
				return
			}
			g = min(g, 4*s)
			d += stepWeight * (math.Abs(math.Log(g/s)) - d)
			s += stepWeight * (g - s)
		} else {
			s = g
		}
		nb := uint64(math.Float32bits(float32(s))) | uint64(math.Float32bits(float32(d)))<<32
		if c.len.CompareAndSwap(b, nb) {
			return
		}
	}
}

// phaseAdj is how much longer than the average, in seconds, a request
// begun now waits for the replica's running step to end, in [-s/2, s/2]
// for a step of s: the step's rest less half a step while a step end was
// seen within the last s; -s/2 on an idle engine (busy 0: nothing runs,
// the request's step begins at once); s/2 on a busy one whose step has
// lasted longer than s (a long prefill: its end is not known, and at least
// as far as a step just begun). 0 when the clock knows no step or the steps
// vary (their gaps' mean absolute log deviation above stepSteady: long
// prefills among short decodes, where a step's length says little of the
// next one's).
func (c *stepClock) phaseAdj(now, busy int64) float64 {
	s, d := c.step()
	if !(s > 0) || d > stepSteady {
		return 0
	}
	if busy == 0 {
		return -s / 2
	}
	el := max(float64(now-c.at.Load())/1e9, 0)
	if el >= s {
		return s / 2
	}
	return s/2 - el
}

// stepSteady is the largest mean absolute log deviation of a replica's
// step gaps at which phaseAdj prices its phase: 0.3, steps within about a
// third of each other.
const stepSteady = 0.3

// Token records that f's streamed answer delivered output at now (one
// read of its events: a step's tokens): f's replica's step clock learns
// when its engine's steps end and how long a decode step lasts. A gap is
// sampled only where no request routed there awaited its first token when
// the step began (at the stream's previous event): a step that runs a
// prefill lasts as long as the prefill, and says nothing of the decode
// steps between them. For every read a stream's relay makes: one read
// lock, as FirstToken (the replica may have been removed and its ID, with
// its hot record, given to another since Begin).
func (r *Router) Token(f *Flight, now int64) {
	if f.Replica == NoReplica || now <= 0 {
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.live(f)
	if p == nil {
		return
	}
	prev, quiet := f.tokAt, f.tokQuiet
	f.tokAt = now
	f.tokQuiet = p.totalPendingReqs() <= 0
	p.step.mark(now)
	if prev > 0 && now > prev && quiet {
		p.step.sample(float64(now-prev) / 1e9)
		if !r.stepClocks.Load() {
			r.stepClocks.Store(true)
		}
	}
}

// stepSeconds is the replica's step length as its clock has it, 0 unknown.
func (p *repHot) stepSeconds() float64 {
	s, _ := p.step.step()
	return s
}
