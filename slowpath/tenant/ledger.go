package tenant

import (
	"sync"
	"time"
)

// Budget is one tenant's limits; a zero field is no limit.
type Budget struct {
	// InputTokensPerMinute bounds prompt tokens over any sliding minute.
	InputTokensPerMinute int64 `yaml:"input_tokens_per_minute"`
	// OutputTokensPerMinute bounds generated tokens over any sliding
	// minute (estimated from max_tokens at admission).
	OutputTokensPerMinute int64 `yaml:"output_tokens_per_minute"`
	// MaxConcurrent bounds the tenant's requests in flight (queued ones
	// included).
	MaxConcurrent int64 `yaml:"max_concurrent"`
}

// Unlimited reports whether b limits nothing.
func (b Budget) Unlimited() bool {
	return b.InputTokensPerMinute == 0 && b.OutputTokensPerMinute == 0 && b.MaxConcurrent == 0
}

// The names of the limits, as a 429's message and the metrics give them.
const (
	LimitInput      = "input_tokens_per_minute"
	LimitOutput     = "output_tokens_per_minute"
	LimitConcurrent = "max_concurrent"
)

// Window is the span the token limits count over; it is cut into
// Buckets buckets of BucketWidth, the resolution of the slide.
const (
	Window      = time.Minute
	Buckets     = 60
	BucketWidth = Window / Buckets
)

// Usage is a tenant's usage on one instance: tokens over the window and
// requests in flight.
type Usage struct {
	In, Out, InFlight int64
}

// Denial says which limit refused a request and when to retry.
type Denial struct {
	Limit string
	// Used is the fleet's count the limit compared (local + peers), Want
	// what the request would add, Max the limit.
	Used, Want, Max int64
	// RetryAfter is when enough of the window slides out for the request
	// to fit (at least 1s); Window when the request alone exceeds Max.
	RetryAfter time.Duration
	// TooLarge: Want alone is over Max; waiting does not help.
	TooLarge bool
}

// Ticket is one admitted request's charge, handed back to End.
type Ticket struct {
	a       *account
	bucket  int64 // absolute bucket number the estimate was charged to
	in, out int64 // the estimate charged
}

// Active reports whether t holds a charge (End not yet called).
func (t *Ticket) Active() bool { return t.a != nil }

// Ledger is the per-tenant accounting. Safe for concurrent use; every
// method takes the time as nanoseconds on any monotonic clock shared by
// all calls (slowpath passes its own clock).
type Ledger struct {
	mu      sync.Mutex
	acct    map[string]*account
	peerTTL int64
	// OnChange, if set before use, is called (outside the lock) after a
	// local change a peer should hear of: an admission or an end.
	OnChange func()
}

type account struct {
	in, out  [Buckets]int64
	stamp    [Buckets]int64 // absolute bucket number held by each slot (+1: 0 = empty)
	inFlight int64
	peers    map[string]peerUsage
	sent     Usage // what Local last reported
}

type peerUsage struct {
	u  Usage
	at int64
}

// NewLedger returns an empty ledger; a peer's reported usage counts for
// peerTTL after its report (a silent peer's usage stops counting).
func NewLedger(peerTTL time.Duration) *Ledger {
	return &Ledger{acct: make(map[string]*account), peerTTL: int64(peerTTL)}
}

func (l *Ledger) account(tenant string) *account {
	a := l.acct[tenant]
	if a == nil {
		a = &account{}
		l.acct[tenant] = a
	}
	return a
}

func bucketOf(now int64) int64 { return now / int64(BucketWidth) }

// local sums the slots inside the window ending at bucket b.
func (a *account) local(b int64) (in, out int64) {
	for i := range Buckets {
		if s := a.stamp[i] - 1; s > b-Buckets && s <= b {
			in += a.in[i]
			out += a.out[i]
		}
	}
	return in, out
}

func (a *account) peerSum(now, ttl int64) Usage {
	var u Usage
	for _, p := range a.peers {
		if now-p.at <= ttl {
			u.In += p.u.In
			u.Out += p.u.Out
			u.InFlight += p.u.InFlight
		}
	}
	return u
}

func (a *account) charge(b, in, out int64) {
	i := b % Buckets
	if a.stamp[i] != b+1 {
		a.stamp[i], a.in[i], a.out[i] = b+1, 0, 0
	}
	a.in[i] += in
	a.out[i] += out
}

// freedBy returns how long from now until the local window has let go of
// at least need tokens of the series pick chooses; ok false when the
// local slots alone never free that much.
func (a *account) freedBy(now, need int64, pick func(i int) int64) (time.Duration, bool) {
	b := bucketOf(now)
	var freed int64
	for k := max(b-Buckets+1, 0); k <= b; k++ {
		i := k % Buckets
		if a.stamp[i] != k+1 {
			continue
		}
		if freed += pick(int(i)); freed >= need {
			// Slot k leaves the window when bucket k+Buckets begins.
			return time.Duration((k+Buckets)*int64(BucketWidth) - now), true
		}
	}
	return 0, false
}

// Admit charges a request's estimate (in prompt tokens, out output
// tokens, one request in flight) to tenant if budget allows it, counting
// what peers report; otherwise it charges nothing and says why. An
// unlimited budget always admits (and still counts, for the peers).
func (l *Ledger) Admit(tenant string, budget Budget, in, out, now int64, t *Ticket) (Denial, bool) {
	l.mu.Lock()
	a := l.account(tenant)
	b := bucketOf(now)
	li, lo := a.local(b)
	p := a.peerSum(now, l.peerTTL)
	check := func(name string, used, want, lim int64, pick func(int) int64) (Denial, bool) {
		if lim <= 0 || used+want <= lim {
			return Denial{}, true
		}
		d := Denial{Limit: name, Used: used, Want: want, Max: lim, RetryAfter: Window}
		if want > lim {
			d.TooLarge = true
			return d, false
		}
		if pick != nil {
			if ra, ok := a.freedBy(now, used+want-lim, pick); ok {
				d.RetryAfter = ra
			}
		}
		d.RetryAfter = max(d.RetryAfter, time.Second)
		return d, false
	}
	d, ok := check(LimitConcurrent, a.inFlight+p.InFlight, 1, budget.MaxConcurrent, nil)
	if ok {
		d, ok = check(LimitInput, li+p.In, in, budget.InputTokensPerMinute, func(i int) int64 { return a.in[i] })
	}
	if ok {
		d, ok = check(LimitOutput, lo+p.Out, out, budget.OutputTokensPerMinute, func(i int) int64 { return a.out[i] })
	}
	if d.Limit == LimitConcurrent {
		d.RetryAfter = time.Second // a request ends: no window to wait for
	}
	if ok {
		a.charge(b, in, out)
		a.inFlight++
		*t = Ticket{a: a, bucket: b, in: in, out: out}
	}
	fn := l.OnChange
	l.mu.Unlock()
	if ok && fn != nil {
		fn()
	}
	return d, ok
}

// End finishes t: the request leaves the in-flight count and, when the
// engine reported usage (in or out >= 0; -1 unknown), the estimate is
// replaced by it in the bucket it was charged to (if that is still in the
// window). End on an inactive ticket does nothing.
func (l *Ledger) End(t *Ticket, in, out, now int64) {
	a := t.a
	if a == nil {
		return
	}
	l.mu.Lock()
	a.inFlight--
	if i := t.bucket % Buckets; a.stamp[i] == t.bucket+1 && t.bucket > bucketOf(now)-Buckets {
		if in >= 0 {
			a.in[i] = max(a.in[i]+in-t.in, 0)
		}
		if out >= 0 {
			a.out[i] = max(a.out[i]+out-t.out, 0)
		}
	}
	*t = Ticket{}
	fn := l.OnChange
	l.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// Used returns tenant's usage here (Local) and the peers' sum.
func (l *Ledger) Used(tenant string, now int64) (local, peers Usage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.acct[tenant]
	if a == nil {
		return Usage{}, Usage{}
	}
	in, out := a.local(bucketOf(now))
	return Usage{In: in, Out: out, InFlight: a.inFlight}, a.peerSum(now, l.peerTTL)
}

// Local calls fn with each tenant's local usage: every non-zero one when
// all is true (a heartbeat), else only those changed since the last call
// (a zero included once, so peers forget it). Tenants with nothing left
// anywhere are forgotten.
func (l *Ledger) Local(now int64, all bool, fn func(tenant string, u Usage)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := bucketOf(now)
	for name, a := range l.acct {
		in, out := a.local(b)
		u := Usage{In: in, Out: out, InFlight: a.inFlight}
		if u != a.sent || (all && u != (Usage{})) {
			fn(name, u)
			a.sent = u
		}
		for p, pu := range a.peers {
			if now-pu.at > l.peerTTL {
				delete(a.peers, p)
			}
		}
		if u == (Usage{}) && len(a.peers) == 0 {
			delete(l.acct, name)
		}
	}
}

// SetPeer records peer's latest report of tenant's usage on that
// instance (absolute values: the latest replaces the earlier; a zero
// report removes it).
func (l *Ledger) SetPeer(peer, tenant string, u Usage, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.acct[tenant]
	if u == (Usage{}) {
		if a != nil {
			delete(a.peers, peer)
		}
		return
	}
	if a == nil {
		a = l.account(tenant)
	}
	if a.peers == nil {
		a.peers = make(map[string]peerUsage)
	}
	a.peers[peer] = peerUsage{u: u, at: now}
}

// ClearPeer forgets everything peer reported (it left or restarted).
func (l *Ledger) ClearPeer(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acct {
		delete(a.peers, peer)
	}
}
