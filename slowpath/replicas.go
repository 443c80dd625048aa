// About 500 lines, one job: the proxy's replicas (construction, health checks
// and passive ejection, their metrics); eligibility itself is affinity's.

package slowpath

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmpath/warmpath/affinity"
)

// replica is one engine behind the router. The hot path reads id, hc, cfg
// (through an atomic pointer) and consecFail; the rest belongs to the
// replica's control goroutine and the passive-ejection path under mu. Its
// eligibility (healthy, at its in-flight limit) and in-flight count are
// the affinity Router's (rt): the health checks and passive ejection here
// decide, rt.SetHealthy records, and every reader asks rt.
type replica struct {
	id   affinity.ReplicaID
	name string
	rt   *affinity.Router
	hc   *fasthttp.HostClient // proxied traffic
	ctl  *fasthttp.HostClient // health checks and scrapes
	auth []byte               // Authorization towards the engine; nil = the client's (tls.go)
	cfg  atomic.Pointer[ReplicaConfig]

	consecFail atomic.Int32
	removed    atomic.Bool
	firstRound bool        // of the starting configuration: its first probe counts toward readiness
	scrapeBig  atomic.Bool // the last scrape's body was over scrape.body_size_limit

	stop chan struct{}
	done chan struct{}
	m    replicaMetrics
	log  *slog.Logger

	mu           sync.Mutex
	activeOK     int
	activeFail   int
	ejectedUntil time.Time
	ejections    int
	admittedAt   time.Time
	lastProbeErr string
	lastScrape   time.Time
	scrapeErr    string
	sample       engineSample
	stale        bool
	lastCounter  float64
	// props is what llama.cpp's /props or SGLang's /get_server_info said
	// (batch slots; llama.cpp's context per slot, SGLang's radix cache
	// switch); read once per engine start.
	props     engineProps
	propsRead bool
	// propsFails counts reads of it that failed in a row; the next is not
	// tried before propsNext (a back-off from the scrape interval to a
	// minute: an engine that refuses it, such as SGLang with an admin key
	// on /get_server_info, is not asked every scrape).
	propsFails int
	propsNext  time.Time
}

// modelMetrics returns the children for model, or the first model's.
func (r *replica) modelMetrics(model []byte) *modelMetrics {
	for i := range r.m.models {
		if bytes.Equal(r.m.models[i].name, model) {
			return &r.m.models[i]
		}
	}
	return &r.m.models[0]
}

// release follows the End of a flight beginFlight began: the in-flight gauge.
func (r *replica) release() {
	r.m.inFlight.Dec()
}

// full reports whether r is at its in-flight limit.
func (r *replica) full() bool { return r.rt.AtLimit(r.id) }

// isHealthy reports whether r is in rotation. A removed replica is not
// (its id may already name another).
func (r *replica) isHealthy() bool { return !r.removed.Load() && r.rt.Healthy(r.id) }

// inFlight is this router's requests in flight on r.
func (r *replica) inFlight() int64 { return int64(r.rt.InFlight(r.id)) }

// maxInFlight is r's in-flight limit (Server.maxInFlight of its config);
// 0 = unlimited.
func (r *replica) maxInFlight() int64 { return int64(r.rt.MaxInFlight(r.id)) }

// serves reports whether the replica serves model.
func (r *replica) serves(model []byte) bool {
	for _, m := range r.cfg.Load().Models {
		if string(model) == m {
			return true
		}
	}
	return false
}

func (s *Server) spec(rc *ReplicaConfig) affinity.ReplicaSpec {
	return affinity.ReplicaSpec{
		Name:                rc.Address,
		Models:              slices.Clone(rc.Models),
		Weight:              rc.Weight,
		KVCapacityTokens:    rc.KVCapacityTokens,
		PrefillTokensPerSec: rc.PrefillTokensPerSec,
		BatchSlots:          rc.BatchSlots,
		CacheModel:          cacheModels[rc.CacheModel],
		MaxInFlight:         s.maxInFlight(rc),
	}
}

func (s *Server) maxInFlight(rc *ReplicaConfig) int {
	n := s.conf().Limits.MaxInFlightPerReplica
	if rc.MaxInFlight > 0 {
		n = rc.MaxInFlight
	}
	return capByConns(n, s.cfg.Upstream.MaxConnsPerReplica)
}

// applyReplicas makes the replica set equal to list: new addresses are
// added, missing ones removed (their in-flight requests finish on the
// connections they hold), changed ones updated in place.
func (s *Server) applyReplicas(list []ReplicaConfig) error {
	s.repMu.Lock()
	defer s.repMu.Unlock()
	want := make(map[string]*ReplicaConfig, len(list))
	for i := range list {
		want[list[i].Address] = &list[i]
	}
	old := *s.table.Load()
	table := slices.Clone(old)
	var added, removed, updated int
	for name, r := range s.byName {
		if _, ok := want[name]; ok {
			continue
		}
		s.removeLocked(r, table)
		removed++
	}
	for i := range list {
		rc := list[i]
		rc.Models = slices.Clone(rc.Models)
		if r, ok := s.byName[rc.Address]; ok {
			cur := r.cfg.Load()
			if slices.Equal(cur.Models, rc.Models) && sameEngineConn(cur, &rc) {
				if cur.Weight == rc.Weight && cur.KVCapacityTokens == rc.KVCapacityTokens &&
					cur.MaxInFlight == rc.MaxInFlight && cur.PrefillTokensPerSec == rc.PrefillTokensPerSec &&
					cur.BatchSlots == rc.BatchSlots && cur.CacheModel == rc.CacheModel && r.maxInFlight() == int64(s.maxInFlight(&rc)) {
					continue
				}
				if err := s.brain.UpdateReplica(r.id, s.spec(&rc)); err != nil {
					s.table.Store(&table)
					return fmt.Errorf("update replica %s: %w", rc.Address, err)
				}
				r.cfg.Store(&rc)
				updated++
				continue
			}
			// Model list (or engine TLS / key) changed: re-add under a fresh
			// id (metrics children are per model), the old one drains like a
			// removed replica.
			s.removeLocked(r, table)
			updated++
		}
		ec, err := s.engineConn(&rc)
		if err != nil {
			s.table.Store(&table)
			return fmt.Errorf("add replica %s: %w", rc.Address, err)
		}
		id, err := s.brain.AddReplica(s.spec(&rc))
		if err != nil {
			s.table.Store(&table)
			return fmt.Errorf("add replica %s: %w", rc.Address, err)
		}
		r := s.newReplica(id, &rc, ec)
		r.firstRound = s.ops.starting
		for int(id) >= len(table) {
			table = append(table, nil)
		}
		table[id] = r
		s.byName[rc.Address] = r
		added++
		s.wg.Add(1)
		go s.runReplica(r)
	}
	s.table.Store(&table)
	if added+removed+updated > 0 {
		s.log.Info("replica set applied", "added", added, "removed", removed, "updated", updated, "total", len(s.byName))
	}
	return nil
}

// removeLocked takes r out of routing; its in-flight requests finish. s.repMu held.
func (s *Server) removeLocked(r *replica, table []*replica) {
	n := r.inFlight()
	s.brain.RemoveReplica(r.id)
	r.removed.Store(true)
	close(r.stop)
	if int(r.id) < len(table) && table[r.id] == r {
		table[r.id] = nil
	}
	delete(s.byName, r.name)
	s.m.forgetReplica(r.name)
	r.log.Info("replica removed", "in_flight", n)
}

func (s *Server) newReplica(id affinity.ReplicaID, rc *ReplicaConfig, ec engineConn) *replica {
	u := &s.cfg.Upstream
	r := &replica{
		id:   id,
		name: rc.Address,
		rt:   s.brain,
		hc: &fasthttp.HostClient{
			Addr:                          rc.Address,
			MaxConns:                      u.MaxConnsPerReplica,
			MaxIdleConnDuration:           u.MaxIdleConnDuration,
			ReadTimeout:                   u.ResponseTimeout,
			WriteTimeout:                  s.cfg.Limits.ReadTimeout,
			MaxResponseBodySize:           0,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
			NoDefaultUserAgentHeader:      true,
			RetryIfErr:                    retryStaleConn,
			MaxIdemponentCallAttempts:     staleRetries,
			ReadBufferSize:                upstreamReadBuffer,
			Dial:                          tlsDial(ec.tls, s.upstreamDialer(u.DialTimeout, u.IdleTimeout), u.DialTimeout),
		},
		ctl: &fasthttp.HostClient{
			Addr:                     rc.Address,
			MaxConns:                 2,
			MaxIdleConnDuration:      u.MaxIdleConnDuration,
			MaxResponseBodySize:      s.cfg.Scrape.BodySizeLimit,
			NoDefaultUserAgentHeader: true,
			Dial:                     tlsDial(ec.tls, s.dialer(u.DialTimeout), u.DialTimeout),
		},
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		m:          s.m.forReplica(rc.Address, rc.Models),
		log:        s.log.With("replica", rc.Address),
		admittedAt: time.Now(),
	}
	r.cfg.Store(rc)
	r.m.healthy.Set(1) // AddReplica admits it: passive ejection catches a dead one
	if r.auth = ec.auth; r.auth != nil {
		s.ops.anyAuth.Store(true)
	}
	return r
}

// retryStaleConn retries on a fresh connection when a pooled keep-alive
// connection turned out closed by the engine before any response byte (the
// engine's idle timeout fired while the connection sat in the pool: uvicorn,
// under vLLM and SGLang, closes idle connections after 5s). After a quiet
// period every pooled connection may be stale, so a burst can meet several in
// a row: up to staleRetries attempts (also set as the HostClient's
// MaxIdemponentCallAttempts, which caps them). A stale connection fails at
// once, so the bound costs nothing but is needed. Everything else goes to the
// next replica.
func retryStaleConn(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
	return false, attempts < staleRetries && isStaleConn(err)
}

const staleRetries = 16

func isStaleConn(err error) bool {
	return errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// dialer dials with a plain net.Dialer: fasthttp.TCPDialer would start a
// DNS-cache cleaner goroutine per replica that never stops (a leak per
// reload). Dials are rare: connections are pooled.
func (s *Server) dialer(timeout time.Duration) fasthttp.DialFunc {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return func(addr string) (net.Conn, error) {
		return d.Dial("tcp", addr)
	}
}

// setHealthyLocked flips the replica's routing eligibility in the affinity
// Router; r.mu held (the health checks and passive ejection of r take it,
// so the check and the flip are one step).
func (s *Server) setHealthyLocked(r *replica, h bool, why string) {
	if r.removed.Load() || r.rt.Healthy(r.id) == h {
		return
	}
	s.brain.SetHealthy(r.id, h)
	if h {
		r.m.healthy.Set(1)
		r.admittedAt = time.Now()
		r.consecFail.Store(0)
		// It may have restarted while out: its cache is gone.
		s.brain.ResetCache(r.id)
		r.log.Info("replica admitted", "reason", why)
	} else {
		r.m.healthy.Set(0)
		r.log.Warn("replica out of rotation", "reason", why)
	}
}

// proxyFailed records a failed attempt (connect error, reset, retryable
// status) and ejects the replica after Passive.ConsecutiveFailures.
func (s *Server) proxyFailed(r *replica, err error) {
	n := r.consecFail.Add(1)
	pc := &s.conf().Passive
	th := pc.ConsecutiveFailures
	if th <= 0 || int(n) < th {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.isHealthy() {
		return
	}
	now := time.Now()
	if now.Sub(r.admittedAt) > pc.MaxEjectTime {
		r.ejections = 0 // behaved for long enough: start over
	}
	r.ejections++
	d := pc.EjectTime << min(r.ejections-1, 16)
	if d > pc.MaxEjectTime || d <= 0 {
		d = pc.MaxEjectTime
	}
	r.ejectedUntil = now.Add(d)
	r.activeOK = 0
	r.m.ejections.Inc()
	r.consecFail.Store(0)
	s.setHealthyLocked(r, false, fmt.Sprintf("ejected for %s after %d consecutive failures: %v", d, n, err))
}

func (r *replica) proxyOK() {
	if r.consecFail.Load() != 0 {
		r.consecFail.Store(0)
	}
}

// runReplica is the replica's control loop: health probes and scrapes, at
// the intervals of the running config (a reload that changes them resets
// the tickers; scrape.interval 0 stops scraping).
func (s *Server) runReplica(r *replica) {
	defer s.wg.Done()
	defer close(r.done)
	defer r.ctl.CloseIdleConnections()
	wake := s.reloadSignal()
	hInt, sInt := s.conf().Health.Interval, s.conf().Scrape.Interval
	s.probe(r)
	s.ops.firstProbeDone(r)
	if sInt > 0 {
		s.scrape(r)
	}
	ht := time.NewTicker(hInt)
	defer ht.Stop()
	st := time.NewTicker(scrapeTick(sInt))
	defer st.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-s.closing:
			return
		case <-ht.C:
			s.probe(r)
		case <-st.C:
			if sInt > 0 {
				s.scrape(r)
			}
		case <-wake:
			wake = s.reloadSignal()
			c := s.conf()
			if c.Health.Interval != hInt {
				hInt = c.Health.Interval
				ht.Reset(hInt)
			}
			if c.Scrape.Interval != sInt {
				sInt = c.Scrape.Interval
				st.Reset(scrapeTick(sInt))
			}
		}
	}
}

// scrapeTick is the scrape ticker's period: scrape.interval, or an hour
// while scraping is off (the ticks are ignored then).
func scrapeTick(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Hour
	}
	return d
}

func (s *Server) get(r *replica, path string, timeout time.Duration, resp *fasthttp.Response) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(path)
	req.Header.SetHost(r.name)
	req.Header.SetMethod(fasthttp.MethodGet)
	if r.auth != nil {
		req.Header.SetBytesKV(hdrAuthorization, r.auth)
	}
	return r.ctl.DoTimeout(req, resp, timeout)
}

// probe runs one active health check.
func (s *Server) probe(r *replica) {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	hc := &s.conf().Health
	err := s.get(r, hc.Path, hc.Timeout, resp)
	if err == nil && (resp.StatusCode() < 200 || resp.StatusCode() > 299) {
		err = fmt.Errorf("status %d", resp.StatusCode())
	}
	h := &s.conf().Health
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.activeOK = 0
		r.activeFail++
		r.lastProbeErr = err.Error()
		if r.activeFail >= h.UnhealthyThreshold {
			s.setHealthyLocked(r, false, "health check: "+r.lastProbeErr)
		}
		return
	}
	r.activeFail = 0
	r.activeOK++
	r.lastProbeErr = ""
	if !r.isHealthy() && r.activeOK >= h.HealthyThreshold && !time.Now().Before(r.ejectedUntil) {
		s.setHealthyLocked(r, true, fmt.Sprintf("%d consecutive good health checks", r.activeOK))
	}
}

// scrape reads the engine's /metrics and feeds the brain.
func (s *Server) scrape(r *replica) {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	sc := &s.conf().Scrape
	mark := s.brain.MarkSignals(r.id)
	err := s.get(r, sc.Path, sc.Timeout, resp)
	err = s.scrapeSize(r, err)
	if err == nil && resp.StatusCode() != fasthttp.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode())
	}
	var sm engineSample
	if err == nil {
		sm = parseEngineMetrics(resp.Body())
		if !sm.Known {
			err = errNoKnownMetrics
		}
	}
	r.mu.Lock()
	needProps := err == nil && (sm.Llama || sm.SGLang) && (!r.propsRead || (r.lastCounter >= 0 && sm.Counter >= 0 && sm.Counter < r.lastCounter)) &&
		!time.Now().Before(r.propsNext)
	r.mu.Unlock()
	var props engineProps
	var perr error
	if needProps {
		props, perr = s.readProps(r, resp, sm.SGLang)
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if needProps {
		switch {
		case perr != nil:
			r.propsFails++
			r.propsNext = now.Add(min(sc.Interval<<min(r.propsFails, 12), time.Minute))
			r.log.Debug("engine description unreadable", "err", perr, "failures", r.propsFails, "next", r.propsNext)
		case sm.SGLang:
			r.props, r.propsRead, r.propsFails, r.propsNext = props, true, 0, time.Time{}
			r.log.Info("engine batch slots from /get_server_info", "max_running_requests", props.TotalSlots, "disable_radix_cache", props.NoPrefixCache)
		default:
			r.props, r.propsRead, r.propsFails, r.propsNext = props, true, 0, time.Time{}
			r.log.Info("engine batch slots from /props", "total_slots", props.TotalSlots, "n_ctx_per_slot", props.SlotContext, "fresh_slots", props.FreshSlots)
		}
	}
	if r.removed.Load() {
		return
	}
	if err != nil {
		r.m.scrapeErrors.Inc()
		r.scrapeErr = err.Error()
		if !r.stale && now.Sub(r.lastScrape) > s.conf().Scrape.StaleAfter {
			r.stale = true
			// Too old to trust: clear, so routing uses in-flight counts.
			s.brain.SetSignals(r.id, affinity.EngineSignals{}) // At 0 = never: ignored
		}
		return
	}
	if r.lastCounter >= 0 && sm.Counter >= 0 && sm.Counter < r.lastCounter {
		r.log.Info("engine counters went backwards: restarted, forgetting its cache")
		s.brain.ResetCache(r.id)
	}
	r.lastCounter = sm.Counter
	r.sample = sm
	r.lastScrape = now
	r.scrapeErr = ""
	r.stale = false
	s.brain.SetSignals(r.id, affinity.EngineSignals{
		Waiting:          sm.Waiting,
		Running:          sm.Running,
		KVUsage:          sm.KVUsage,
		KVCapacityTokens: sm.KVCapacityTokens,
		BatchSlots:       r.props.TotalSlots,
		SlotCaches:       sm.Llama,
		NoPrefixCache:    sm.NoPrefixCache || r.props.NoPrefixCache,
		FreshSlots:       r.props.FreshSlots,
		At:               s.now(),
		Mark:             mark,
	})
}

// readProps reads the engine's own description with resp (reset first):
// llama.cpp's /props, or SGLang's /get_server_info.
func (s *Server) readProps(r *replica, resp *fasthttp.Response, sglang bool) (engineProps, error) {
	resp.Reset()
	path, parse := "/props", parseProps
	if sglang {
		path, parse = "/get_server_info", parseServerInfo
	}
	if err := s.get(r, path, s.conf().Scrape.Timeout, resp); err != nil {
		return engineProps{}, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return engineProps{}, fmt.Errorf("%s: status %d", path, resp.StatusCode())
	}
	p, err := parse(resp.Body())
	if err != nil || sglang {
		return p, err
	}
	// Which slots hold nothing yet: the others hold prompts the router
	// never saw (affinity.EngineSignals.FreshSlots). Optional: a server
	// run with --no-slots answers 501, and its slots stay unknown.
	resp.Reset()
	err = s.get(r, "/slots", s.conf().Scrape.Timeout, resp)
	if err == nil && resp.StatusCode() != fasthttp.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode())
	}
	if err == nil {
		p.FreshSlots, err = parseSlots(resp.Body())
	}
	if err != nil {
		r.log.Debug("engine slots unreadable: slots it ran before are unknown", "err", err)
	}
	return p, nil
}
