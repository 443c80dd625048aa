package slowpath

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/slowpath/cluster"
	"github.com/warmpath/warmpath/slowpath/tenant"
)

// TenantsConfig turns on multi-tenancy: API keys (a keys file of hashed
// keys, each naming a tenant), per-tenant token budgets, priority classes
// and the fair queue. Everything is off by default. Only the keys file's
// content is reloaded (it is polled every reload_interval); the block
// itself is not.
type TenantsConfig struct {
	// KeysFile holds the hashed API keys and the tenants' budgets (format:
	// tenant.ParseKeys, docs/tenants.md). Set, every routed request and
	// /v1/models need `Authorization: Bearer <key>` with a listed key,
	// else 401. Empty (default): no keys, no budgets.
	KeysFile string `yaml:"keys_file"`
	// Salt is the cache salt of a keyed request (injected as vLLM's
	// cache_salt and seeding the prefix hashes): "tenant" (default: a
	// tenant's keys share its cache), "key" (every key its own) or "none"
	// (tenants share the cache, and the cache-timing side channel is
	// open: docs/tenants.md). With a salt, a request's own cache_salt is
	// refused (400): it would name another tenant's namespace.
	Salt string `yaml:"salt"`
	// ForwardKey passes the client's Authorization header on to the
	// engines. Default false: engines never see tenants' keys.
	ForwardKey bool `yaml:"forward_key"`
	// DefaultMaxTokens is the output estimate charged at admission for a
	// request without max_tokens / max_completion_tokens. Default 1024.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// PriorityHeader names the header that picks a request's priority
	// class (high, normal, low). A key's class is its requests' default
	// and the highest they may ask for. Default "X-Warmpath-Priority".
	PriorityHeader string `yaml:"priority_header"`
	// Queue is the fair queue for when every replica is at its cap.
	Queue FairQueueConfig `yaml:"queue"`
}

// FairQueueConfig: with Enabled, a request that finds every replica for
// its model at its in-flight cap (max_in_flight) waits in a router-side
// queue, served by priority class and, within a class, by deficit
// round-robin across tenants on estimated tokens.
type FairQueueConfig struct {
	Enabled bool `yaml:"enabled"`
	// MaxLength bounds the queued requests per model and class; past it
	// the tenant holding the most gives up its newest (429) or the
	// newcomer is refused (429). Default 1024.
	MaxLength int `yaml:"max_length"`
	// Timeout is a request's longest wait in the queue (then 503).
	// Default 30s.
	Timeout time.Duration `yaml:"timeout"`
	// Quantum is the deficit round-robin quantum in estimated tokens: a
	// tenant gets at most one quantum plus one request ahead of its fair
	// share of tokens. Smaller is finer-grained (a request costing more
	// than the quantum waits several rounds, each round a few operations).
	// Default 512.
	Quantum int `yaml:"quantum"`
	// Reserve holds this many of a model's slots (the sum of its healthy
	// replicas' max_in_flight) back from any one tenant: a tenant may
	// hold at most slots - reserve of them, so another tenant's request
	// finds a free slot at once instead of waiting for one to free. It
	// trades throughput for latency: a tenant alone leaves the reserve
	// idle. 0 (default): work-conserving, no reserve. Applies only when
	// every replica of the model has a cap.
	Reserve int `yaml:"reserve"`
	// Headroom turns on the prefill guard: while two or more tenants are
	// active on a model, a tenant at or over its equal share of the
	// model's slots starts a request only where no other tenant's request
	// waits for its first token, and only while this many free slots stay
	// on replicas where no such tenant's prefill runs (with one replica:
	// on it). Another tenant's request then finds a slot at once on a
	// replica whose batch steps carry no long prefill. A tenant alone is
	// never held back. 0 (default): off. Applies only when every replica
	// of the model has a cap.
	Headroom int `yaml:"headroom"`
	// HeadroomMin is the fewest free slots the prefill guard keeps
	// however many requests the other tenants run: headroom counts the
	// others' running requests as part of it, down to this. 1 (default):
	// the others' next request finds a slot, a burst of two may wait for
	// a release; headroom_min = headroom keeps headroom free slots beside
	// whatever the others run, at a higher cost to the flood. In [1,
	// headroom] when headroom is set.
	HeadroomMin int `yaml:"headroom_min"`
	// ActiveWindow is how long a tenant counts as active on a model after
	// its last request arrived (besides while it has requests queued or
	// running): the tenants sharing the slots for the guard. Default 2s.
	ActiveWindow time.Duration `yaml:"active_window"`
}

// Tenants salt values.
const (
	TenantSaltTenant = "tenant"
	TenantSaltKey    = "key"
	TenantSaltNone   = "none"
)

// DefaultTenants is the tenants block's default (everything off).
func DefaultTenants() TenantsConfig {
	return TenantsConfig{
		Salt: TenantSaltTenant, DefaultMaxTokens: 1024, PriorityHeader: "X-Warmpath-Priority",
		Queue: FairQueueConfig{MaxLength: 1024, Timeout: 30 * time.Second, Quantum: 512, HeadroomMin: 1, ActiveWindow: 2 * time.Second},
	}
}

func (t *TenantsConfig) validate(c *Config) error {
	switch t.Salt {
	case TenantSaltTenant, TenantSaltKey, TenantSaltNone:
	default:
		return fieldErrorf("tenants.salt", "must be tenant, key or none, got %q", t.Salt)
	}
	q := &t.Queue
	switch {
	case t.KeysFile != "" && c.Tenancy.SaltFrom != SaltFromNone:
		return fieldErrorf("tenants.keys_file", "tenancy.salt_from must be none with a keys file (tenants.salt sets the salt), got %q", c.Tenancy.SaltFrom)
	case t.DefaultMaxTokens < 0 || t.DefaultMaxTokens > 1<<24:
		return fieldErrorf("tenants.default_max_tokens", "must be in [0, 16777216], got %d", t.DefaultMaxTokens)
	case t.PriorityHeader == "":
		return fieldErrorf("tenants.priority_header", "must be a header name, got empty")
	case q.MaxLength < 1 || q.MaxLength > 1<<20:
		return fieldErrorf("tenants.queue.max_length", "must be in [1, 1048576], got %d", q.MaxLength)
	case q.Timeout <= 0:
		return fieldErrorf("tenants.queue.timeout", "must be > 0, got %s", q.Timeout)
	case q.Quantum < 1 || q.Quantum > 1<<24:
		return fieldErrorf("tenants.queue.quantum", "must be in [1, 16777216], got %d", q.Quantum)
	case q.Reserve < 0 || q.Reserve > 1<<20:
		return fieldErrorf("tenants.queue.reserve", "must be in [0, 1048576] (0 = none), got %d", q.Reserve)
	case q.Headroom < 0 || q.Headroom > 1<<20:
		return fieldErrorf("tenants.queue.headroom", "must be in [0, 1048576] (0 = off), got %d", q.Headroom)
	case q.HeadroomMin < 1 || q.HeadroomMin > max(q.Headroom, 1):
		return fieldErrorf("tenants.queue.headroom_min", "must be in [1, headroom (%d)], got %d", max(q.Headroom, 1), q.HeadroomMin)
	case q.ActiveWindow <= 0 || q.ActiveWindow > time.Hour:
		return fieldErrorf("tenants.queue.active_window", "must be in (0s, 1h], got %s", q.ActiveWindow)
	}
	return nil
}

// tenantState is one exchange's tenant bookkeeping.
type tenantState struct {
	key     *tenant.Key
	name    string // tenant name ("" without keys)
	class   int
	salt    []byte // salt material (nil: no tenant salt), in saltBuf
	saltBuf []byte
	ticket  tenant.Ticket
	budget  tenant.Budget
	in, out int64 // engine-reported usage; -1 unknown
	est     int64 // estimated tokens (queue cost)
	// dispatched: counted in the fair queue's per-tenant running count
	// (tenants.queue.reserve) until the exchange ends.
	dispatched bool
	// front: forward found every ranked slot taken; the fair queue takes
	// it back at its tenant's head.
	front bool
	// heavy: dispatched while its tenant was over its share (the prefill
	// guard, tenants.queue.headroom).
	heavy bool
	// pendOn is the replica where it waits for its first token (the
	// prefill guard); pendUntil ends a non-streamed request's wait at its
	// predicted TTFT (0: at its first token).
	pendOn    *replica
	pendUntil int64
	// held is the replica whose slot the prefill guard took for it when
	// it placed it (its flight begun), until forward's first attempt
	// there uses it (takeSlot) or it is given back (unhold).
	held *replica
}

func (t *tenantState) reset() {
	*t = tenantState{class: tenant.DefaultClass, in: -1, out: -1, saltBuf: t.saltBuf[:0]}
}

// tenants is the server's keys and ledger (nil without a keys file).
type tenants struct {
	keys   atomic.Pointer[tenant.Keys]
	ledger *tenant.Ledger
	path   string
	last   []byte
}

// startTenants loads the keys file and starts its reload loop; it also
// builds the fair queue. Called by New before anything is served.
func (s *Server) startTenants() error {
	tc := &s.cfg.Tenants
	s.prioHeader = []byte(tc.PriorityHeader)
	s.tm = newTenantMetrics(s.reg)
	if tc.Queue.Enabled {
		s.fq = newFairQueue(s, tc.Queue)
		s.freed.onSignal = s.fq.kick
	}
	if tc.KeysFile == "" {
		return nil
	}
	peerTTL := 3 * time.Second
	if s.cfg.Cluster.Enabled() {
		peerTTL = s.cfg.Cluster.WithDefaults().PeerTimeout
	}
	t := &tenants{ledger: tenant.NewLedger(peerTTL), path: tc.KeysFile}
	k, b, err := loadKeys(tc.KeysFile)
	if err != nil {
		return err
	}
	t.keys.Store(k)
	t.last = b
	s.ten = t
	s.log.Info("tenants: keys loaded", "file", tc.KeysFile, "keys", k.Len(), "tenants", len(k.Tenants()))
	if s.cfg.ReloadInterval > 0 {
		s.wg.Add(1)
		go s.watchKeys()
	}
	return nil
}

// loadKeys reads and parses a keys file; the file must not be writable
// by others (anyone could add a key).
func loadKeys(path string) (*tenant.Keys, []byte, error) {
	if err := CheckConfigPerms(path); err != nil {
		return nil, nil, fieldErrorf("tenants.keys_file", "%w", err)
	}
	b, err := readStable(path, os.ReadFile, settleTime)
	if err != nil {
		return nil, nil, fieldErrorf("tenants.keys_file", "%w", err)
	}
	k, err := tenant.ParseKeys(b)
	if err != nil {
		return nil, nil, fmt.Errorf("tenants.keys_file %s: %w", path, err)
	}
	return k, b, nil
}

// watchKeys polls the keys file and swaps the keys in when its content
// changes and parses; a bad file keeps the running keys (logged, counted).
func (s *Server) watchKeys() {
	defer s.wg.Done()
	tk := time.NewTicker(s.cfg.ReloadInterval)
	defer tk.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-tk.C:
			s.reloadKeys()
		}
	}
}

// reloadKeys re-reads the keys file if its content changed.
func (s *Server) reloadKeys() {
	t := s.ten
	b, err := os.ReadFile(t.path)
	if err != nil || bytes.Equal(b, t.last) {
		return
	}
	k, nb, err := loadKeys(t.path)
	if err != nil {
		s.tm.keyReloads.WithLabelValues("error").Inc()
		s.log.Error("tenants: keys file not reloaded; the running keys stay", "err", err)
		t.last = b
		return
	}
	t.keys.Store(k)
	t.last = nb
	s.tm.keyReloads.WithLabelValues("ok").Inc()
	s.log.Info("tenants: keys reloaded", "keys", k.Len(), "tenants", len(k.Tenants()))
}

var strBearer = []byte("Bearer ")

// authenticate checks the request's API key; without a valid one it
// answers 401 in OpenAI's shape and returns nil.
func (s *Server) authenticate(ctx *fasthttp.RequestCtx) *tenant.Key {
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	if len(h) == 0 {
		s.reject(ctx, apiInvalidKey,
			"You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).", "")
		return nil
	}
	key, ok := bytes.CutPrefix(h, strBearer)
	if !ok || len(key) == 0 {
		key = nil
	}
	e, found := s.ten.keys.Load().Lookup(bytes.TrimSpace(key))
	if !found {
		// The key is never echoed (OpenAI shows a masked one).
		s.reject(ctx, apiInvalidKey, "Incorrect API key provided.", "")
		return nil
	}
	return e
}

// tenantPrepare fills ex's tenant state from the key (nil without keys)
// and the priority header; false after answering 400.
func (s *Server) tenantPrepare(ctx *fasthttp.RequestCtx, ex *exchange, key *tenant.Key) bool {
	ts := &ex.ten
	ts.key = key
	if key != nil {
		ts.name, ts.class = key.Tenant, key.Class
		if t := s.ten.keys.Load().Tenant(key.Tenant); t != nil {
			ts.budget = t.Budget
		}
		switch s.cfg.Tenants.Salt {
		case TenantSaltTenant:
			ts.saltBuf = append(append(ts.saltBuf[:0], "warmpath tenant\x00"...), key.Tenant...)
			ts.salt = ts.saltBuf
		case TenantSaltKey:
			ts.saltBuf = append(append(ts.saltBuf[:0], "warmpath key\x00"...), key.Hash[:]...)
			ts.salt = ts.saltBuf
		}
	}
	if v := ctx.Request.Header.PeekBytes(s.prioHeader); len(v) > 0 {
		c, ok := tenant.ParseClass(string(v))
		if !ok {
			s.reject(ctx, apiBadPriority, "Invalid "+s.cfg.Tenants.PriorityHeader+" header: must be one of "+strings.Join(tenant.Classes, ", ")+".", "")
			return false
		}
		if key != nil {
			c = max(c, key.Class) // a key's class is the highest it may ask for
		}
		ts.class = c
	}
	return true
}

// tenantAdmit charges the request's estimate to its tenant's budget;
// false after answering 429 (or 400 for a cache_salt of its own under a
// tenant salt).
func (s *Server) tenantAdmit(ctx *fasthttp.RequestCtx, ex *exchange, ep endpoint) bool {
	ts := &ex.ten
	in := int64(ex.prompt.Tokens)
	out := int64(ex.prompt.MaxTokens)
	if out <= 0 {
		out = int64(s.cfg.Tenants.DefaultMaxTokens)
	}
	if ep != epChat && ep != epCompletion && ep != epResponses {
		out = 0 // embeddings, pass-through: nothing generated
	}
	ts.est = in + out
	if s.ten == nil || ts.key == nil {
		return true
	}
	d, ok := s.ten.ledger.Admit(ts.name, ts.budget, in, out, s.now(), &ts.ticket)
	if ok {
		return true
	}
	ra := int64(math.Ceil(d.RetryAfter.Seconds()))
	msg := fmt.Sprintf("Rate limit reached for tenant %s on %s: limit %d, used %d, requested %d. Please try again in %ds.", ts.name, d.Limit, d.Max, d.Used, d.Want, ra)
	if d.TooLarge {
		msg = fmt.Sprintf("Request too large for tenant %s on %s: limit %d, requested %d.", ts.name, d.Limit, d.Max, d.Want)
	}
	s.reject(ctx, apiTenantBudget, msg, "")
	ctx.Response.Header.SetBytesK(hdrRetryAfter, strconv.FormatInt(ra, 10))
	s.tm.budgetRejected.WithLabelValues(ts.name, d.Limit).Inc()
	return false
}

// tenantEnd returns the exchange's charge, corrected with the engine's
// usage when it reported one (putExchange: every path out).
func (s *Server) tenantEnd(ex *exchange) {
	if ex.ten.held != nil {
		s.fq.unhold(ex) // placed, never attempted
	}
	if ex.ten.pendOn != nil {
		s.fq.prefilled(ex)
	}
	if ex.ten.dispatched {
		s.fq.finished(ex)
	}
	if ex.ten.ticket.Active() {
		s.ten.ledger.End(&ex.ten.ticket, ex.ten.in, ex.ten.out, s.now())
	}
}

// tenantCharge corrects the tenant's charge with the engine's usage as
// read into ex.promptRep and ex.outTok (usageTokens); -1 where not reported.
func (ex *exchange) tenantCharge() {
	if ex.ten.ticket.Active() {
		ex.ten.in, ex.ten.out = int64(ex.promptRep), int64(ex.outTok)
	}
}

// tenancyMode names how prompts are salted, for the cluster's hash
// fingerprint (instances salting differently never mix their hashes).
func (s *Server) tenancyMode() string {
	if s.cfg.Tenants.KeysFile != "" && s.cfg.Tenants.Salt != TenantSaltNone {
		return "keys-" + s.cfg.Tenants.Salt
	}
	return s.cfg.Tenancy.SaltFrom
}

// usageShare is the ledger as the cluster shares it (nil without keys).
func (s *Server) usageShare() cluster.UsageLedger {
	if s.ten == nil {
		return nil
	}
	return ledgerShare{s}
}

// ledgerShare puts the router's clock behind the ledger for the cluster.
type ledgerShare struct{ s *Server }

func (l ledgerShare) LocalUsage(all bool, fn func(tenant string, in, out, inFlight int64)) {
	l.s.ten.ledger.Local(l.s.now(), all, func(t string, u tenant.Usage) { fn(t, u.In, u.Out, u.InFlight) })
}

func (l ledgerShare) SetPeerUsage(peer, t string, in, out, inFlight int64) {
	l.s.ten.ledger.SetPeer(peer, t, tenant.Usage{In: in, Out: out, InFlight: inFlight}, l.s.now())
}
