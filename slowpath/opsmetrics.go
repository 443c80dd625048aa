package slowpath

import (
	"bytes"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fastjson"
)

// opsMetrics are the collectors of readiness, TLS and the access log.
type opsMetrics struct {
	certReloads   *prometheus.CounterVec // result
	accessDropped prometheus.Counter
}

func newOpsMetrics(reg prometheus.Registerer) opsMetrics {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: name, Help: help}
	}
	m := opsMetrics{
		certReloads:   prometheus.NewCounterVec(prometheus.CounterOpts(o("tls_cert_reloads_total", "Reloads of the API listener's key pair after its files changed, by result.")), []string{"result"}),
		accessDropped: prometheus.NewCounter(prometheus.CounterOpts(o("access_log_dropped_total", "Access log lines dropped because the writer could not keep up."))),
	}
	reg.MustRegister(m.certReloads, m.accessDropped)
	return m
}

// stateCollector exports, read at scrape time: readiness, draining, the
// certificate's expiry and each replica's engine signals as the last scrape
// found them (series only for replicas with fresh signals; the engine's
// prefix-cache counters only when it reports them).
type stateCollector struct {
	s                                   *Server
	ready, draining, notAfter           *prometheus.Desc
	waiting, running, kvUsage, kvCap    *prometheus.Desc
	queries, hits, hitRatio, scrapedAge *prometheus.Desc
}

func newStateCollector(s *Server) *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metricNamespace, metricSubsystem, name), help, labels, nil)
	}
	return &stateCollector{
		s:          s,
		ready:      d("ready", "1 when /readyz answers 200 (first health round done, not draining, a healthy replica)."),
		draining:   d("draining", "1 once a graceful stop began (readiness fails, in-flight requests finish)."),
		notAfter:   d("tls_cert_not_after_timestamp_seconds", "Expiry of the API listener's certificate (Unix time); absent without tls."),
		waiting:    d("engine_requests_waiting", "Requests waiting in the engine's queue (its own metric, last scrape).", "replica"),
		running:    d("engine_requests_running", "Requests the engine is running (last scrape).", "replica"),
		kvUsage:    d("engine_kv_cache_usage_ratio", "The engine's KV-cache usage, 0..1 (last scrape).", "replica"),
		kvCap:      d("engine_kv_capacity_tokens", "The engine's KV-cache capacity in tokens (cache_config_info); absent when not reported.", "replica"),
		queries:    d("engine_prefix_cache_queries_tokens_total", "The engine's own prefix-cache lookups, in tokens (vLLM prefix_cache_queries_total); absent when not reported.", "replica"),
		hits:       d("engine_prefix_cache_hits_tokens_total", "The engine's own prefix-cache hits, in tokens (vLLM prefix_cache_hits_total); absent when not reported.", "replica"),
		hitRatio:   d("engine_prefix_cache_hit_ratio", "The engine's own cache hit rate (SGLang cache_hit_rate); absent when not reported.", "replica"),
		scrapedAge: d("engine_signals_age_seconds", "Seconds since the replica's engine metrics were last scraped successfully.", "replica"),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.ready, c.draining, c.notAfter, c.waiting, c.running, c.kvUsage, c.kvCap,
		c.queries, c.hits, c.hitRatio, c.scrapedAge} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	ok, _ := c.s.Ready()
	g(c.ready, b2f(ok))
	g(c.draining, b2f(c.s.ops.draining.Load()))
	if cr := c.s.ops.cert; cr != nil {
		g(c.notAfter, float64(cr.notAfter.Load()))
	}
	now := time.Now()
	for _, r := range c.s.byNameSnapshot() {
		r.mu.Lock()
		sm, at, stale := r.sample, r.lastScrape, r.stale
		r.mu.Unlock()
		if at.IsZero() {
			continue
		}
		g(c.scrapedAge, now.Sub(at).Seconds(), r.name)
		if stale {
			continue
		}
		g(c.waiting, float64(sm.Waiting), r.name)
		g(c.running, float64(sm.Running), r.name)
		g(c.kvUsage, finite(sm.KVUsage), r.name)
		if sm.KVCapacityTokens > 0 {
			g(c.kvCap, float64(sm.KVCapacityTokens), r.name)
		}
		if sm.PrefixQueries >= 0 {
			ch <- prometheus.MustNewConstMetric(c.queries, prometheus.CounterValue, sm.PrefixQueries, r.name)
		}
		if sm.PrefixHits >= 0 {
			ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, sm.PrefixHits, r.name)
		}
		if sm.HitRatio >= 0 {
			g(c.hitRatio, sm.HitRatio, r.name)
		}
	}
}

var _ prometheus.Collector = (*stateCollector)(nil)

// usageTokens reads usage.prompt_tokens and usage.completion_tokens (the
// Responses API's input_tokens and output_tokens) from the last "usage" object of a body or stream event, parsing that object
// alone (a large body is not parsed whole a second time); -1 for each one
// missing.
func usageTokens(p *fastjson.Parser, body []byte) (prompt, completion int) {
	prompt, completion = -1, -1
	i := bytes.LastIndex(body, strUsage)
	if i < 0 {
		return
	}
	rest := bytes.TrimLeft(body[i+len(strUsage):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	end := objectEnd(rest)
	if end < 0 {
		return
	}
	v, err := p.ParseBytes(rest[:end+1])
	if err != nil {
		return
	}
	return usageCounts(v)
}

// usageCounts reads a parsed usage object's prompt and completion tokens
// (or the Responses API's input and output tokens); -1 where absent.
func usageCounts(v *fastjson.Value) (prompt, completion int) {
	get := func(k string) int {
		x := v.Get(k)
		if x == nil {
			return -1
		}
		if n, err := x.Int(); err == nil && n >= 0 {
			return n
		}
		return -1
	}
	prompt, completion = get("prompt_tokens"), get("completion_tokens")
	if prompt < 0 && completion < 0 { // the Responses API's names
		prompt, completion = get("input_tokens"), get("output_tokens")
	}
	return prompt, completion
}

// countTokens adds an answer's reported tokens to the throughput counters
// and, for a stream, its mean inter-token latency.
func (s *Server) countTokens(ex *exchange, now int64) {
	mm := ex.mm
	if ex.promptRep > 0 {
		mm.promptTok.Add(float64(ex.promptRep))
	}
	if ex.outTok > 0 {
		mm.outputTok.Add(float64(ex.outTok))
	}
	if ex.stream != nil && ex.outTok >= 2 && ex.firstAt > 0 && now > ex.firstAt {
		mm.itl.Observe(seconds(now-ex.firstAt) / float64(ex.outTok-1))
	}
}
