package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// errRestart fails the flights a restart cut off.
var (
	errRestart = errors.New("engine restarted")
	errClosed  = errors.New("server closed")
)

// Server is the real-time face of an Engine: an OpenAI-compatible HTTP
// server whose engine runs on the wall clock scaled by Config.TimeScale.
// Several Servers can run in one process (each has its own metrics
// registry). Close must be called to stop its scheduler goroutine.
type Server struct {
	cfg    Config
	log    *slog.Logger
	models map[string]modelInfo // served names and adapters
	base   string               // model_name label and adapters' parent
	http   *http.Server
	addr   atomic.Pointer[string]
	met    *metrics

	mu      sync.Mutex // guards eng, flights, nextID
	eng     *Engine
	metBase EngineStats // engine counters at the last Restart: /metrics counts from there
	epoch   time.Time
	flights map[*flight]struct{}
	nextID  uint64

	faults   atomic.Pointer[Faults]
	rngMu    sync.Mutex
	rng      *rand.Rand
	served   map[string]*atomic.Int64
	restarts atomic.Int64
	injected atomic.Int64
	// cancelled counts API requests whose client went away mid-request
	cancelled atomic.Int64
	responses responseStore // stored Responses API answers (responses.go)

	wake      chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	loopDone  chan struct{}

	hmu     sync.Mutex // guards active, hclosed
	hcond   *sync.Cond // signalled when active drops to 0
	active  int        // handlers running
	hclosed bool       // no new handlers
}

type modelInfo struct {
	adapter string // "" for base model names
}

// Stats is a snapshot for tests and the demo.
type Stats struct {
	Engine         EngineStats
	Served         map[string]int64 // completed API responses by requested model
	Restarts       int64
	FaultsInjected int64
	InFlight       int
	// Cancelled counts API requests whose client connection closed before
	// the response was complete (the request's context was cancelled).
	Cancelled int64
}

// flight is one HTTP request's view of its engine request. The observer
// (under Server.mu) writes it under its own mu and pokes notify.
type flight struct {
	req    Request
	notify chan struct{}

	mu     sync.Mutex
	tokens int
	cached int
	finish FinishReason
	done   bool
	err    error
}

func (f *flight) poke() {
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

type flightState struct {
	tokens, cached int
	finish         FinishReason
	done           bool
	err            error
}

func (f *flight) state() flightState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return flightState{f.tokens, f.cached, f.finish, f.done, f.err}
}

// NewServer validates cfg and starts the engine's scheduler goroutine. Serve
// (or Start) serves HTTP; Close stops both.
func NewServer(cfg Config) (*Server, error) {
	eng, err := NewEngine(cfg)
	if err != nil {
		return nil, fmt.Errorf("enginesim config: %w", err)
	}
	cfg.ServedModelNames = append([]string(nil), cfg.ServedModelNames...)
	cfg.LoRAModules = append([]string(nil), cfg.LoRAModules...)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		cfg:      cfg,
		log:      log.With("component", "enginesim"),
		models:   map[string]modelInfo{},
		base:     cfg.ServedModelNames[0],
		eng:      eng,
		epoch:    time.Now(),
		flights:  map[*flight]struct{}{},
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0xfa017)),
		served:   map[string]*atomic.Int64{},
		wake:     make(chan struct{}, 1),
		closing:  make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	for _, n := range cfg.ServedModelNames {
		s.models[n] = modelInfo{}
		s.served[n] = new(atomic.Int64)
	}
	for _, n := range cfg.loraNames() {
		s.models[n] = modelInfo{adapter: n}
		s.served[n] = new(atomic.Int64)
	}
	s.hcond = sync.NewCond(&s.hmu)
	f := cfg.Faults
	s.faults.Store(&f)
	s.met = newMetrics(s)
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go s.loop()
	return s, nil
}

// Start listens on addr ("127.0.0.1:0" for tests) and serves in the
// background.
func Start(cfg Config, addr string) (*Server, error) {
	s, err := NewServer(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	a := ln.Addr().String()
	s.addr.Store(&a)
	go func() {
		if err := s.Serve(ln); err != nil {
			s.log.Error("serve", "addr", a, "err", err)
		}
	}()
	return s, nil
}

// Serve serves HTTP on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	a := ln.Addr().String()
	s.addr.Store(&a)
	s.log.Info("engine simulator serving", "addr", a, "models", s.cfg.ServedModelNames,
		"lora", s.cfg.LoRAModules, "num_gpu_blocks", s.cfg.NumGPUBlocks, "time_scale", s.cfg.TimeScale)
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Addr is the listening address (host:port), "" before Serve.
func (s *Server) Addr() string {
	if p := s.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// Close stops serving, fails in-flight requests, stops the scheduler and
// waits for handlers to return.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closing)
		err = s.http.Close()
		<-s.loopDone
		s.mu.Lock()
		s.failFlightsLocked(errClosed)
		s.mu.Unlock()
		s.hmu.Lock()
		s.hclosed = true
		for s.active > 0 {
			s.hcond.Wait()
		}
		s.hmu.Unlock()
	})
	return err
}

// SetFaults replaces the injected faults. Out-of-range values are clamped
// (ErrorRate to [0, 1], a bad ErrorStatus to 500, negative values to 0); the
// admin endpoint rejects them instead.
func (s *Server) SetFaults(f Faults) {
	if !(f.ErrorRate >= 0) { // negative or NaN
		f.ErrorRate = 0
	}
	f.ErrorRate = min(f.ErrorRate, 1)
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		f.ErrorStatus = 0
	}
	f.Latency = max(f.Latency, 0)
	f.CloseAfterChunks = max(f.CloseAfterChunks, 0)
	f.StallAfterChunks = max(f.StallAfterChunks, 0)
	s.faults.Store(&f)
	s.log.Info("faults set", "faults", fmt.Sprintf("%+v", f))
}

// Faults returns the current injected faults.
func (s *Server) Faults() Faults { return *s.faults.Load() }

// Restart simulates an engine restart: in-flight requests lose their
// connection and the KV cache is wiped. The engine counters on /metrics
// start again from zero (a router sees them go backwards); Stats and Served
// keep their cumulative totals.
func (s *Server) Restart() {
	s.mu.Lock()
	s.failFlightsLocked(errRestart)
	s.eng.Reset()
	s.metBase = s.eng.Stats() // Prometheus counters start again from zero
	s.mu.Unlock()
	s.restarts.Add(1)
	s.met.restarts.Inc()
	s.log.Info("engine restarted: KV cache wiped")
}

func (s *Server) failFlightsLocked(err error) {
	for f := range s.flights {
		f.mu.Lock()
		if !f.done {
			f.done, f.err = true, err
		}
		f.mu.Unlock()
		f.poke()
		delete(s.flights, f)
	}
}

// Served returns how many API responses completed for model.
func (s *Server) Served(model string) int64 {
	if c := s.served[model]; c != nil {
		return c.Load()
	}
	return 0
}

// Stats returns a snapshot.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	es := s.eng.Stats()
	inflight := len(s.flights)
	s.mu.Unlock()
	st := Stats{Engine: es, Served: map[string]int64{}, Restarts: s.restarts.Load(),
		FaultsInjected: s.injected.Load(), InFlight: inflight, Cancelled: s.cancelled.Load()}
	for n, c := range s.served {
		st.Served[n] = c.Load()
	}
	return st
}

// Config returns the server's configuration.
func (s *Server) Config() Config { return s.cfg }

// vnow is the engine's virtual time now. Callers hold s.mu or accept a
// racy-but-monotonic read (time.Since is monotonic).
func (s *Server) vnow() int64 {
	return int64(float64(time.Since(s.epoch)) / s.cfg.TimeScale)
}

// wallUntil is the wall time until virtual time t.
func (s *Server) wallUntil(t int64) time.Duration {
	at := time.Duration(float64(t) * s.cfg.TimeScale)
	return max(at-time.Since(s.epoch), 0)
}

// loop drives the engine on the scaled wall clock.
func (s *Server) loop() {
	defer close(s.loopDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	obs := (*observer)(s)
	for {
		s.mu.Lock()
		s.eng.Advance(s.vnow(), obs)
		next := s.eng.NextEventTime()
		s.mu.Unlock()
		wait := time.Hour
		if next != NoEvent {
			wait = s.wallUntil(next)
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-s.wake:
		case <-s.closing:
			return
		}
	}
}

// enter registers a running handler; false once Close began.
func (s *Server) enter() bool {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.hclosed {
		return false
	}
	s.active++
	return true
}

func (s *Server) leave() {
	s.hmu.Lock()
	s.active--
	if s.active == 0 {
		s.hcond.Broadcast()
	}
	s.hmu.Unlock()
}

func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// submit hands f.req to the engine.
func (s *Server) submit(f *flight) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.closing:
		return errClosed
	default:
	}
	now := s.vnow()
	s.eng.Advance(now, (*observer)(s))
	s.nextID++
	f.req.ID = s.nextID
	f.req.Data = f
	if err := s.eng.Submit(&f.req, now); err != nil {
		return err
	}
	s.flights[f] = struct{}{}
	s.poke()
	return nil
}

// abort drops f from the engine (client gone, injected close).
func (s *Server) abort(f *flight) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.flights[f]; ok {
		s.eng.Abort(&f.req, s.vnow())
		delete(s.flights, f)
	}
}

// observer receives engine events under s.mu.
type observer Server

func (o *observer) OnToken(r *Request, at int64) {
	f, ok := r.Data.(*flight)
	if !ok {
		return
	}
	f.mu.Lock()
	f.tokens, f.cached = r.OutputTokens, r.CachedTokens
	f.mu.Unlock()
	if r.OutputTokens == 1 {
		o.met.ttft.Observe(time.Duration(at - r.Arrival).Seconds())
	}
	f.poke()
}

func (o *observer) OnFinish(r *Request, at int64) {
	f, ok := r.Data.(*flight)
	if !ok {
		return
	}
	f.mu.Lock()
	f.finish, f.done = r.Finish, true
	f.mu.Unlock()
	o.met.finished(r, at)
	delete(o.flights, f)
	f.poke()
}

var (
	_ Observer     = (*observer)(nil)
	_ http.Handler = (*Server)(nil)
)

// decideError draws the injected error for one request.
func (s *Server) decideError(rate float64) bool {
	if rate <= 0 {
		return false
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < rate
}

// sleep waits d of wall time unless ctx ends or the server closes.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-s.closing:
	}
	return false
}
