package slowpath

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// opsState is the Server's operational state: readiness, drain, TLS and
// the access log (ready.go, tls.go, accesslog.go).
type opsState struct {
	draining atomic.Bool
	// firstLeft counts the replicas of the initial configuration whose
	// first health check has not finished; probed is closed at zero.
	firstLeft  atomic.Int64
	probed     chan struct{}
	probedOnce sync.Once
	starting   bool // set while newServer applies the initial replicas

	cert    *certReloader // nil without tls
	anyAuth atomic.Bool   // some replica has an engine key (setEngineAuth)
	access  *accessLog    // nil without log.access
}

func (o *opsState) init(initial int) {
	o.probed = make(chan struct{})
	o.firstLeft.Store(int64(initial))
	if initial == 0 {
		o.probedOnce.Do(func() { close(o.probed) })
	}
}

// firstProbeDone is called once per replica after its first health check.
func (o *opsState) firstProbeDone(r *replica) {
	if r.firstRound && o.firstLeft.Add(-1) == 0 {
		o.probedOnce.Do(func() { close(o.probed) })
	}
}

// Probed is closed once every replica of the starting configuration has
// had its first health check (the first health round).
func (s *Server) Probed() <-chan struct{} { return s.ops.probed }

// Readiness reasons.
const (
	NotReadyStarting  = "starting"           // before the first health round
	NotReadyDraining  = "draining"           // SetDraining was called (SIGTERM)
	NotReadyNoReplica = "no_healthy_replica" // no model has a healthy replica
)

// Ready reports whether the router should receive traffic: the first
// health round is done, it is not draining, and at least one replica (so at
// least one model) is healthy, its last health check passed. When not,
// reason is one of the NotReady* constants.
func (s *Server) Ready() (ok bool, reason string) {
	if s.ops.draining.Load() {
		return false, NotReadyDraining
	}
	select {
	case <-s.ops.probed:
	default:
		return false, NotReadyStarting
	}
	for _, r := range s.byNameSnapshot() {
		r.mu.Lock()
		h := r.isHealthy() && r.lastProbeErr == ""
		r.mu.Unlock()
		if h {
			return true, ""
		}
	}
	return false, NotReadyNoReplica
}

// SetDraining makes readiness fail from now on; requests are still served
// and the listeners stay open. Responses then carry Connection: close, so
// clients on keep-alive connections reconnect (through the load balancer,
// to another instance). Drain calls it; it cannot be undone.
func (s *Server) SetDraining() { s.ops.draining.Store(true) }

// Drain is the graceful stop: SetDraining, then shutdown.drain_delay with
// the API listener still accepting and serving (the load balancer sees
// /readyz fail and stops sending), then Shutdown (stop accepting, in-flight
// requests finish within drain_timeout). Cancelling ctx cuts both waits:
// the delay ends and Shutdown closes what is still open.
func (s *Server) Drain(ctx context.Context) error {
	s.SetDraining()
	if d := s.cfg.Shutdown.DrainDelay; d > 0 {
		s.log.Info("draining: readiness fails, still serving", "drain_delay", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, max(s.cfg.DrainTimeout, time.Second))
		defer cancel()
	}
	s.log.Info("draining: listener closed, waiting for in-flight requests", "in_flight", s.inflight.Load())
	return s.Shutdown(ctx)
}

var (
	bodyReady = []byte(`{"status":"ready"}`)
	bodyLive  = []byte(`{"status":"ok"}`)
)

func notReadyBody(reason string) []byte {
	return []byte(`{"status":"not_ready","reason":"` + reason + `"}`)
}

// handleTop is the API listener's handler: /readyz and /livez, then the
// proxy (handle). While draining every response closes its connection.
func (s *Server) handleTop(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/readyz", "/livez":
		if !ctx.IsGet() && !ctx.IsHead() {
			s.reject(ctx, apiMethod, "Method "+string(ctx.Method())+" not allowed for "+string(ctx.Path())+"; use GET", "")
			ctx.Response.Header.SetBytesKV(hdrAllow, strGET)
			break
		}
		ctx.SetContentTypeBytes(strAppJSON)
		if string(ctx.Path()) == "/livez" {
			ctx.SetBody(bodyLive)
			break
		}
		if ok, why := s.Ready(); ok {
			ctx.SetBody(bodyReady)
		} else {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBody(notReadyBody(why))
		}
	default:
		s.handle(ctx)
	}
	if s.ops.draining.Load() {
		ctx.SetConnectionClose()
	}
}

// adminReadyz and adminLivez serve the same on the admin listener.
func (s *Server) adminReadyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	ok, why := s.Ready()
	if ok {
		_, _ = w.Write(bodyReady)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(notReadyBody(why))
}

func (s *Server) adminLivez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(bodyLive)
}

// initOps loads the TLS key pair, opens the access log and registers the
// state collector (newServer, before the replicas start).
func (s *Server) initOps() error {
	if t := &s.cfg.TLS; t.Enabled() {
		c, err := newCertReloader(t.CertFile, t.KeyFile, s.log)
		if err != nil {
			return err
		}
		s.ops.cert = c
	}
	if l := &s.cfg.Log; l.AccessOn() {
		a, err := openAccessLog(l.Access, l.Format, s.m.ops.accessDropped)
		if err != nil {
			return err
		}
		s.ops.access = a
	}
	s.reg.MustRegister(newStateCollector(s))
	if s.ops.cert != nil && s.cfg.ReloadInterval > 0 {
		s.wg.Add(1)
		go s.watchCert()
	}
	return nil
}

// stopOps flushes and closes the access log (after the loops stopped).
func (s *Server) stopOps() {
	if s.ops.access != nil {
		s.ops.access.close()
	}
}
