// Over 500 lines: the Server type, its construction and lifecycle, and
// the /debug/replicas status that reads its fields stay in one file.

package slowpath

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/cluster"
)

// Server is the L7 router: a fasthttp server for the OpenAI API in front of
// a set of engine replicas, plus an admin HTTP server for metrics and debug.
//
// Lifecycle: New starts the replicas' health and scrape
// loops; Serve/ServeAdmin block serving listeners; Shutdown stops accepting,
// drains in-flight requests up to its context's deadline, force-closes what
// remains and stops the loops. A Server is not restartable.
type Server struct {
	// Observer, if set before Serve, is told about every proxied request
	// (the fast-path promotion hook). nil means none.
	Observer Observer

	cfg           Config                 // as started; restart-only fields are read here
	live          atomic.Pointer[Config] // running: live fields as last reloaded (conf)
	reloaded      atomic.Pointer[chan struct{}]
	cfgPath       string
	log           *slog.Logger
	brain         *affinity.Router // ranking, flights, load and the prefix index
	cluster       *cluster.Node    // nil unless cluster.nats_url is set
	newParser     func() *affinity.Parser
	reg           *prometheus.Registry
	m             *metrics
	connM         *connMetrics
	maxConns      int // limits.max_connections, resolved
	sessionHeader []byte
	trusted       []netip.Prefix // trusted_proxies

	srv   *fasthttp.Server
	admin *http.Server

	repMu  sync.Mutex
	byName map[string]*replica
	table  atomic.Pointer[[]*replica] // by ReplicaID; nil = free slot

	inflight atomic.Int64
	freed    gate
	// holdMu: requests woken from a slot hold decide and begin one at a
	// time (holdSlot).
	holdMu sync.Mutex
	// Tenants (tenants.go, queue.go): keys and ledger (nil without a keys
	// file), the fair queue (nil unless enabled).
	ten        *tenants
	fq         *fairQueue
	tm         *tenantMetrics
	prioHeader []byte
	// exFree is the exchange free list. Not a sync.Pool: a GC would drop
	// the pooled parsers and their grown scratch buffers, and the next
	// requests would rebuild them.
	exFree  chan *exchange
	epoch   time.Time
	started time.Time

	closing   chan struct{}
	closeOnce sync.Once
	// lns are the API listeners Serve was given, closed by Shutdown: a
	// Serve that had not yet handed its listener to fasthttp when
	// Shutdown ran would otherwise accept forever.
	lnMu sync.Mutex
	lns  []net.Listener
	wg   sync.WaitGroup

	connMu sync.Mutex
	conns  map[net.Conn]struct{}

	reloadMu sync.Mutex
	lastFile []byte

	cors *corsPolicy // nil = CORS off (cors.go)
	api  *apiServer  // response-id store, merged model cards (responses.go, models.go)
	ops  opsState    // readiness, drain, TLS, access log (ready.go, tls.go, accesslog.go)
}

// maxHeaderBytes bounds a request's line and headers (fasthttp's read
// buffer): room for long bearer tokens and cookies.
const maxHeaderBytes = 16 << 10

// New validates cfg, builds the affinity router and the replica set, and
// starts health checks and scraping. log may be nil (slog.Default()).
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("slowpath config: %w", err)
	}
	key, keyID, err := LoadHashKey(cfg.HashKeyFile)
	if err != nil {
		return nil, fmt.Errorf("slowpath config: %w", err)
	}
	rt, err := affinity.NewRouter(cfg.Routing)
	if err != nil {
		return nil, err
	}
	hc := rt.HashConfig()
	s, err := newServer(cfg, log, rt, func() *affinity.Parser { return affinity.NewKeyedParser(hc, key) })
	if err != nil {
		return nil, err
	}
	s.reg.MustRegister(affinity.NewCollector(rt))
	if cfg.Cluster.Enabled() {
		// Connects in the background; no request waits on it.
		if s.cluster, err = cluster.Start(cluster.Options{Config: cfg.Cluster, Router: rt,
			Tenancy: s.tenancyMode(), HashKeyed: key != 0, KeyID: keyID, Logger: log, Registerer: s.reg,
			Usage: s.usageShare()}); err != nil {
			s.stopLoops()
			return nil, err
		}
		if s.ten != nil {
			s.ten.ledger.OnChange = s.cluster.KickUsage // before serving: no request yet
		}
	}
	return s, nil
}

// newServer builds a Server around b; New adds the cluster and the
// affinity collector.
func newServer(cfg Config, log *slog.Logger, b *affinity.Router, newParser func() *affinity.Parser) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{
		cfg:           cfg,
		log:           log.With("component", "slowpath"),
		brain:         b,
		newParser:     newParser,
		reg:           reg,
		m:             newMetrics(reg),
		connM:         newConnMetrics(reg),
		maxConns:      resolveMaxConns(cfg.Limits.MaxConnections),
		sessionHeader: []byte(cfg.SessionHeader),
		trusted:       must(parseTrusted(cfg.TrustedProxies)), // validated
		byName:        make(map[string]*replica),
		epoch:         time.Now(),
		started:       time.Now(),
		closing:       make(chan struct{}),
		conns:         make(map[net.Conn]struct{}),
	}
	s.cors, s.api = newCORS(cfg.CORS), newAPIServer()
	empty := []*replica{}
	s.table.Store(&empty)
	running := cfg
	s.live.Store(&running)
	wake := make(chan struct{})
	s.reloaded.Store(&wake)
	s.exFree = make(chan *exchange, min(max(256, cfg.Limits.MaxInFlight), 4096))
	l := &cfg.Limits
	s.srv = &fasthttp.Server{
		Handler:               s.handleTop,
		ErrorHandler:          s.serverError,
		ExpectHandler:         s.expect,
		Name:                  "warmpath",
		ReadTimeout:           l.ReadTimeout,
		WriteTimeout:          l.WriteTimeout,
		IdleTimeout:           l.IdleTimeout,
		MaxRequestBodySize:    l.MaxBodyBytes,
		ReadBufferSize:        maxHeaderBytes, // bounds the request line + headers
		WriteBufferSize:       serverWriteBuffer,
		CloseOnShutdown:       true,
		NoDefaultContentType:  true,
		NoDefaultServerHeader: true,
		ConnState:             s.connState,
		Logger:                fasthttpLogger{s.log},
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/replicas", s.debugReplicas)
	mux.HandleFunc("GET /debug/config", s.debugConfig)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.adminReadyz)
	mux.HandleFunc("GET /livez", s.adminLivez)
	// The admin listener is loopback by default, but still bounded: a
	// client that connects and sends nothing, or never reads, is cut.
	s.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10}
	if err := s.startTenants(); err != nil {
		s.stopLoops()
		return nil, fmt.Errorf("slowpath config: %w", err)
	}
	if err := s.initOps(); err != nil {
		s.stopLoops()
		return nil, fmt.Errorf("slowpath config: %w", err)
	}
	s.ops.init(len(cfg.Replicas))
	s.ops.starting = true
	err := s.applyReplicas(cfg.Replicas)
	s.ops.starting = false
	if err != nil {
		s.stopLoops()
		return nil, err
	}
	return s, nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func (s *Server) newExchange() *exchange {
	return &exchange{s: s, parser: s.newParser(), cached: -1}
}

// now is the monotonic clock handed to the brain, in nanoseconds.
func (s *Server) now() int64 { return int64(time.Since(s.epoch)) }

// Now is the router's clock (monotonic nanoseconds, the one given to
// affinity and in RoutedEvent.Start/End), for the fast-path control loop.
func (s *Server) Now() int64 { return s.now() }

// Config returns the configuration the server runs with: live fields as
// last reloaded (replicas as last applied are also in Replicas()).
func (s *Server) Config() Config { return *s.conf() }

// Registry is the Prometheus registry served on the admin address.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Router is the affinity router.
func (s *Server) Router() *affinity.Router { return s.brain }

// Cluster is the scale-out node (nil unless cluster.nats_url is set).
func (s *Server) Cluster() *cluster.Node { return s.cluster }

// Serve serves the OpenAI API on ln until Shutdown. It returns nil after a
// Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.lnMu.Lock()
	select {
	case <-s.closing:
		s.lnMu.Unlock()
		_ = ln.Close()
		return nil
	default:
	}
	s.lns = append(s.lns, ln)
	s.lnMu.Unlock()
	var l net.Listener = &connListener{
		Listener: ln, stall: s.cfg.Limits.StallTimeout, log: s.log, m: s.connM,
		maxConns: int64(s.maxConns), perClient: s.cfg.Limits.MaxConnectionsPerClient,
		clients: make(map[netip.Addr]int),
	}
	if s.ops.cert != nil {
		l = tls.NewListener(l, s.ops.cert.listenerTLS())
	}
	err := s.srv.Serve(l)
	select {
	case <-s.closing:
		return nil
	default:
	}
	if err != nil {
		return fmt.Errorf("serve api: %w", err)
	}
	return nil
}

// ServeAdmin serves /metrics, /debug/replicas and /health on ln until
// Shutdown.
func (s *Server) ServeAdmin(ln net.Listener) error {
	err := s.admin.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve admin: %w", err)
}

// AdminHandler is the admin mux, for embedding.
func (s *Server) AdminHandler() http.Handler { return s.admin.Handler }

// Shutdown stops accepting, lets in-flight requests (streams included)
// finish until ctx is done, then closes the connections still open, stops
// health checks and scrapes and closes the admin server. Without a deadline
// on ctx, drain_timeout applies.
func (s *Server) Shutdown(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok && s.cfg.DrainTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.DrainTimeout)
		defer cancel()
	}
	s.lnMu.Lock()
	s.closeOnce.Do(func() { close(s.closing) })
	s.lnMu.Unlock()
	err := s.srv.ShutdownWithContext(ctx)
	s.lnMu.Lock()
	for _, ln := range s.lns {
		_ = ln.Close()
	}
	s.lnMu.Unlock()
	if err == nil {
		// fasthttp does not wait for hijacked connections (HTTP/1.0
		// streams): the exchanges still in flight are theirs.
		err = s.waitIdle(ctx)
	}
	if err != nil {
		s.connMu.Lock()
		n := len(s.conns)
		for c := range s.conns {
			_ = c.Close()
		}
		s.connMu.Unlock()
		s.log.Warn("drain deadline passed: closed connections still in flight", "connections", n)
		// Give the handlers a moment to observe the closed connections.
		ctx2, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.srv.ShutdownWithContext(ctx2)
		cancel()
	}
	actx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = s.admin.Shutdown(actx)
	cancel()
	s.stopLoops()
	if s.cluster != nil {
		s.cluster.Close()
	}
	for _, r := range s.byNameSnapshot() {
		r.hc.CloseIdleConnections()
	}
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	return nil
}

// waitIdle waits until no request is in flight or ctx is done.
func (s *Server) waitIdle(ctx context.Context) error {
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func (s *Server) stopLoops() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	s.stopOps()
}

func (s *Server) byNameSnapshot() []*replica {
	s.repMu.Lock()
	defer s.repMu.Unlock()
	out := make([]*replica, 0, len(s.byName))
	for _, r := range s.byName {
		out = append(out, r)
	}
	return out
}

func (s *Server) connState(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		s.connMu.Lock()
		s.conns[c] = struct{}{}
		s.connMu.Unlock()
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		s.connMu.Lock()
		delete(s.conns, c)
		s.connMu.Unlock()
	}
}

// serverError answers requests fasthttp could not read.
func (s *Server) serverError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small) || errors.Is(err, fasthttp.ErrSmallReadBuffer):
		s.reject(ctx, apiHeadersTooLarge,
			fmt.Sprintf("Request line and headers exceed %d bytes.", maxHeaderBytes), "")
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		s.reject(ctx, apiTooLarge,
			fmt.Sprintf("Request body exceeds the limit of %d bytes.", s.cfg.Limits.MaxBodyBytes), "")
	default:
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			s.reject(ctx, apiReadTimeout, "Timed out reading the request.", "")
			return
		}
		s.reject(ctx, apiMalformedHTTP, "Malformed HTTP request.", "")
	}
}

// ReplicaStatus is one replica as GET /debug/replicas shows it.
type ReplicaStatus struct {
	Name   string   `json:"name"`
	ID     int      `json:"id"`
	Models []string `json:"models"`
	// Host is the replica's fast-path GPU host (ReplicaConfig.Host or the
	// IPv4 host of its address); empty when it has none.
	Host                string    `json:"host,omitempty"`
	Healthy             bool      `json:"healthy"`
	InFlight            int64     `json:"in_flight"`
	MaxInFlight         int64     `json:"max_in_flight"`
	ConsecutiveFailures int32     `json:"consecutive_failures"`
	Ejections           int       `json:"ejections"`
	EjectedUntil        time.Time `json:"ejected_until,omitzero"`
	LastProbeError      string    `json:"last_probe_error,omitempty"`
	Engine              struct {
		Waiting          int       `json:"waiting"`
		Running          int       `json:"running"`
		KVUsage          float64   `json:"kv_usage_ratio"` // 0..1
		KVCapacityTokens int       `json:"kv_capacity_tokens"`
		BatchSlots       int       `json:"batch_slots"` // llama.cpp /props total_slots, SGLang /get_server_info max_running_requests; 0 = not reported
		SlotContext      int       `json:"slot_context_tokens"`
		FreshSlots       int       `json:"fresh_slots,omitempty"` // llama.cpp /slots read with /props: slots that held nothing then
		ScrapedAt        time.Time `json:"scraped_at,omitzero"`
		Stale            bool      `json:"stale"`
		Error            string    `json:"error,omitempty"`
	} `json:"engine"`
	// Affinity is the routing brain's view (nil when it does not list the replica).
	Affinity *AffinityStatus `json:"affinity,omitempty"`
}

// PrefillShapeStatus is affinity.PrefillShape in /debug/replicas.
type PrefillShapeStatus struct {
	PerToken        float64 `json:"per_token_seconds"`
	PerPair         float64 `json:"per_pair_seconds"`
	PerContextToken float64 `json:"per_context_token_seconds"`
	// ContextTokensMax: the longest cached context the pool's prefills
	// showed lately; per_context_token_seconds prices up to it.
	ContextTokensMax float64 `json:"context_tokens_max"`
}

// AffinityStatus is affinity.ReplicaStatus as /debug/replicas shows it.
type AffinityStatus struct {
	Healthy              bool          `json:"healthy"`
	Draining             bool          `json:"draining"`
	Weight               float64       `json:"weight"`
	InFlight             int           `json:"in_flight"`
	PendingPrefillTokens int           `json:"pending_prefill_tokens"`
	PrefillTokensPerSec  float64       `json:"prefill_tokens_per_sec"`
	CachedBlocks         int           `json:"cached_blocks"`
	CapacityBlocks       int           `json:"capacity_blocks"`
	Mispredictions       uint64        `json:"mispredictions"`
	Signals              SignalsStatus `json:"signals"`
	// PeerInFlight and PeerPendingTokens are the other instances' load on
	// the replica (cluster mode; 0 alone).
	PeerInFlight      int `json:"peer_in_flight"`
	PeerPendingTokens int `json:"peer_pending_prefill_tokens"`
	// The TTFT model (affinity/ttft.go): batch slots in use (configured,
	// engine-reported or learned; 0 = unknown), seconds a request holds
	// one alone on the engine, the relative growth of that per request
	// sharing it (learned over its pool; 0 = not yet), fitted overhead, the engine's own prefill rate (0 = not
	// reported), trust in predicted hits (the realised share of them,
	// 0..1), the TTFT each request already on the replica adds to a new
	// one's (learned over its pool; 0 = not yet), and TTFT predictions
	// checked with their mean |ln(predicted / measured TTFT)|. CacheModel
	// is how hits are predicted: "shared" (the prefix index), "slots"
	// (the replica's per-slot caches replayed: llama.cpp) or "none" (no
	// prefix caching: none predicted). RAMCacheTokens is, for "slots",
	// the engine's host RAM prompt cache size as learned from the tokens
	// it reuses (0 = not learned yet: the model keeps its last 32 saves).
	CacheModel     string `json:"cache_model"`
	RAMCacheTokens int    `json:"ram_cache_tokens"`
	// HeldRequests are requests the router holds for one of the replica's
	// busy batch slots, which holds their prompt (routing.slot_hold).
	HeldRequests int `json:"held_requests"`
	BatchSlots   int `json:"batch_slots"`
	// While batch_slots is 0: the running count the cost policy suspects
	// a limit at (requests were seen waiting there; 0 = none), and the
	// share of that limit's wait it prices, as requests that met the
	// count measured it (0.5 until four did).
	SuspectedBatchSlots int     `json:"suspected_batch_slots"`
	SlotRiskShare       float64 `json:"slot_risk_share"`
	SlotSeconds         float64 `json:"slot_seconds"`
	SlotLoad            float64 `json:"slot_load"`
	SlotPrefillShare    float64 `json:"slot_prefill_share"`
	// StepSeconds is the engine's step (one token of every running
	// request) as the gaps between a stream's events show it: the cost
	// policy prices a request's wait for the running step with it. 0: no
	// streamed answer seen yet.
	StepSeconds         float64 `json:"step_seconds"`
	OverheadSeconds     float64 `json:"overhead_seconds"`
	EnginePrefillPerSec float64 `json:"engine_prefill_tokens_per_sec"`
	// PrefillShape, where the engine reports its prefill timings and they
	// depend on what a prefill extends (attention): the seconds a
	// request's own prefill is priced per computed token, per attention
	// pair and per cached token it extends. Absent where the prefill is
	// priced at its rate.
	PrefillShape        *PrefillShapeStatus `json:"prefill_shape,omitempty"`
	Confidence          float64             `json:"confidence"`
	BusyCostSeconds     float64             `json:"busy_cost_seconds"`
	TTFTPredictions     uint64              `json:"ttft_predictions"`
	TTFTMeanAbsLogError float64             `json:"ttft_mean_abs_log_error"`
}

// SignalsStatus is affinity.EngineSignals as /debug/replicas shows it: the
// engine signals the routing brain uses, in the names and units of the
// rest of the page.
type SignalsStatus struct {
	Waiting          int     `json:"waiting"`
	Running          int     `json:"running"`
	KVUsage          float64 `json:"kv_usage_ratio"` // 0..1
	KVCapacityTokens int     `json:"kv_capacity_tokens"`
	BatchSlots       int     `json:"batch_slots"` // engine-reported (llama.cpp /props, SGLang /get_server_info); 0 = none
	// ScrapedAt is when the signals were taken; zero (omitted) when there
	// are none the brain trusts (never scraped, or withdrawn as stale).
	ScrapedAt time.Time `json:"scraped_at,omitzero"`
}

// Replicas returns a snapshot of every replica, sorted by name.
func (s *Server) Replicas() []ReplicaStatus {
	aff := map[string]affinity.ReplicaStatus{}
	for _, st := range s.brain.Replicas() {
		aff[st.Name] = st
	}
	reps := s.byNameSnapshot()
	out := make([]ReplicaStatus, 0, len(reps))
	for _, r := range reps {
		var st ReplicaStatus
		st.Name = r.name
		st.ID = int(r.id)
		rc := r.cfg.Load()
		st.Models = rc.Models
		if h := replicaHost(rc); h.IsValid() {
			st.Host = h.String()
		}
		st.InFlight = r.inFlight()
		st.MaxInFlight = r.maxInFlight()
		st.ConsecutiveFailures = r.consecFail.Load()
		r.mu.Lock()
		st.Healthy = r.isHealthy()
		st.Ejections = r.ejections
		if time.Now().Before(r.ejectedUntil) {
			st.EjectedUntil = r.ejectedUntil
		}
		st.LastProbeError = r.lastProbeErr
		st.Engine.Waiting = r.sample.Waiting
		st.Engine.Running = r.sample.Running
		st.Engine.KVUsage = finite(r.sample.KVUsage)
		st.Engine.KVCapacityTokens = r.sample.KVCapacityTokens
		st.Engine.BatchSlots, st.Engine.SlotContext, st.Engine.FreshSlots = r.props.TotalSlots, r.props.SlotContext, r.props.FreshSlots
		st.Engine.ScrapedAt = r.lastScrape
		st.Engine.Stale = r.stale
		st.Engine.Error = r.scrapeErr
		r.mu.Unlock()
		if a, ok := aff[r.name]; ok {
			st.Affinity = &AffinityStatus{
				Healthy: a.Healthy, Draining: a.Draining, Weight: a.Weight, InFlight: a.InFlight,
				PendingPrefillTokens: a.PendingPrefillTokens, PrefillTokensPerSec: a.PrefillTokensPerSec,
				CachedBlocks: a.CachedBlocks, CapacityBlocks: a.CapacityBlocks,
				Mispredictions: a.Mispredictions, Signals: s.signalsStatus(a.Signals),
				PeerInFlight: a.PeerInFlight, PeerPendingTokens: a.PeerPendingTokens,
				BatchSlots: a.BatchSlots, SuspectedBatchSlots: a.SuspectedBatchSlots, SlotRiskShare: finite(a.SlotRiskShare), SlotSeconds: finite(a.SlotSeconds), SlotLoad: finite(a.SlotLoad), SlotPrefillShare: finite(a.SlotPrefillShare), StepSeconds: finite(a.StepSeconds), OverheadSeconds: finite(a.OverheadSeconds),
				EnginePrefillPerSec: finite(a.EnginePrefillRate), Confidence: finite(a.Confidence),
				BusyCostSeconds: finite(a.BusyCostSeconds), CacheModel: cacheModelName(a.SlotCaches, a.NoPrefixCache),
				RAMCacheTokens: a.RAMCacheTokens, HeldRequests: a.HeldRequests,
				TTFTPredictions: a.TTFT.Checked, TTFTMeanAbsLogError: finite(a.TTFT.MeanLogError),
			}
			if sh := a.PrefillShape; sh.Priced() {
				st.Affinity.PrefillShape = &PrefillShapeStatus{PerToken: finite(sh.PerToken), PerPair: finite(sh.PerPair),
					PerContextToken: finite(sh.PerContextToken), ContextTokensMax: finite(sh.ContextTokensMax)}
			}
		}
		out = append(out, st)
	}
	sortReplicaStatus(out)
	return out
}

func sortReplicaStatus(v []ReplicaStatus) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j].Name < v[j-1].Name; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}

// signalsStatus converts the brain's signals; At is on the router's clock.
func (s *Server) signalsStatus(e affinity.EngineSignals) SignalsStatus {
	st := SignalsStatus{Waiting: e.Waiting, Running: e.Running, KVUsage: finite(e.KVUsage), KVCapacityTokens: e.KVCapacityTokens, BatchSlots: e.BatchSlots}
	if e.At != 0 {
		st.ScrapedAt = s.epoch.Add(time.Duration(e.At))
	}
	return st
}

// finite maps NaN and infinities to 0: JSON has no spelling for them.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

func (s *Server) debugReplicas(w http.ResponseWriter, _ *http.Request) {
	var cs *cluster.Status
	if s.cluster != nil {
		st := s.cluster.Status()
		cs = &st
	}
	// Encoded whole before the status is sent: an encoding error is a 500
	// with a JSON error body, not a 200 cut short.
	b, err := json.MarshalIndent(struct {
		Replicas []ReplicaStatus `json:"replicas"`
		InFlight int64           `json:"in_flight"`
		Cluster  *cluster.Status `json:"cluster,omitempty"`
	}{s.Replicas(), s.inflight.Load(), cs}, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		s.log.Error("debug/replicas: encode", "err", err)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write(AppendError(nil, "Could not encode the replica status: "+err.Error(), "internal_error", "", ""))
		return
	}
	_, _ = w.Write(append(b, '\n'))
}

// fasthttpLogger routes fasthttp's own messages to slog at debug level.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug(fmt.Sprintf(format, args...))
}

func cacheModelName(slots, none bool) string {
	switch {
	case slots:
		return "slots"
	case none:
		return "none"
	}
	return "shared"
}
