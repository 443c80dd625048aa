package slowpath

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	metricNamespace = "warmpath"
	metricSubsystem = "slowpath"
)

// metrics are the router's Prometheus collectors, registered on one registry
// per Server (so tests can run several routers in one process).
type metrics struct {
	requests      *prometheus.CounterVec   // model, replica, code
	decision      prometheus.Histogram     // seconds
	predicted     *prometheus.CounterVec   // replica
	actual        *prometheus.CounterVec   // replica
	predictionErr prometheus.Histogram     // |actual-predicted| tokens
	ttft          *prometheus.HistogramVec // model
	e2e           *prometheus.HistogramVec // model
	retries       *prometheus.CounterVec   // replica (the one that failed)
	ejections     *prometheus.CounterVec   // replica
	broken        *prometheus.CounterVec   // replica
	clientGone    *prometheus.CounterVec   // replica
	timeouts      *prometheus.CounterVec   // replica
	inFlight      prometheus.Gauge
	replicaFlight *prometheus.GaugeVec // replica
	healthy       *prometheus.GaugeVec // replica
	scrapeErrors  *prometheus.CounterVec
	scrapeBig     *prometheus.CounterVec   // replica
	reloads       *prometheus.CounterVec   // result
	rejected      *prometheus.CounterVec   // reason
	promptTok     *prometheus.CounterVec   // model, replica
	outputTok     *prometheus.CounterVec   // model, replica
	itl           *prometheus.HistogramVec // model
	holds         *prometheus.CounterVec   // outcome
	holdTime      prometheus.Histogram     // seconds
	ops           opsMetrics               // opsmetrics.go

	// children resolved once for requests that never reached a replica.
	local [600]atomic.Pointer[prometheus.Counter]
}

// sub-millisecond buckets: a decision is microseconds.
var decisionBuckets = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2}

// itlBuckets: decode steps take milliseconds to tens of milliseconds.
var itlBuckets = []float64{0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1}

var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(reg prometheus.Registerer) *metrics {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: name, Help: help}
	}
	h := func(name, help string, b []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: name, Help: help, Buckets: b}
	}
	m := &metrics{
		requests:      prometheus.NewCounterVec(prometheus.CounterOpts(o("requests_total", "Requests answered, by model, replica (\"none\" if not routed) and HTTP status code.")), []string{"model", "replica", "code"}),
		decision:      prometheus.NewHistogram(h("decision_seconds", "Routing decision latency (parse excluded).", decisionBuckets)),
		predicted:     prometheus.NewCounterVec(prometheus.CounterOpts(o("cached_tokens_predicted_total", "Prompt tokens the router predicted were cached on the chosen replica, for requests whose response reported cached_tokens (comparable with cached_tokens_actual_total).")), []string{"replica"}),
		actual:        prometheus.NewCounterVec(prometheus.CounterOpts(o("cached_tokens_actual_total", "Prompt tokens the engine reported cached (usage.prompt_tokens_details.cached_tokens), for requests that reported it.")), []string{"replica"}),
		predictionErr: prometheus.NewHistogram(h("cached_tokens_prediction_error_tokens", "Absolute difference between predicted and reported cached tokens.", prometheus.ExponentialBuckets(1, 4, 10))),
		ttft:          prometheus.NewHistogramVec(h("ttft_seconds", "Time from request arrival to the first upstream stream event with output (a chat role chunk without content does not count; whole response for non-streaming).", latencyBuckets), []string{"model"}),
		e2e:           prometheus.NewHistogramVec(h("request_duration_seconds", "Time from request arrival to the last response byte.", latencyBuckets), []string{"model"}),
		retries:       prometheus.NewCounterVec(prometheus.CounterOpts(o("retries_total", "Attempts that failed before the first byte and moved to the next ranked replica, by the failing replica.")), []string{"replica"}),
		ejections:     prometheus.NewCounterVec(prometheus.CounterOpts(o("ejections_total", "Passive ejections after consecutive failures.")), []string{"replica"}),
		broken:        prometheus.NewCounterVec(prometheus.CounterOpts(o("broken_streams_total", "Responses cut after bytes reached the client (upstream failed mid-stream).")), []string{"replica"}),
		timeouts:      prometheus.NewCounterVec(prometheus.CounterOpts(o("upstream_timeouts_total", "Requests that hit upstream.response_timeout (answered 504, not retried, not counted against the replica).")), []string{"replica"}),
		clientGone:    prometheus.NewCounterVec(prometheus.CounterOpts(o("client_gone_total", "Requests whose client left before the answer began: the upstream request was cancelled (connection closed).")), []string{"replica"}),
		inFlight:      prometheus.NewGauge(prometheus.GaugeOpts(o("in_flight", "Requests currently being proxied."))),
		replicaFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts(o("replica_in_flight", "Requests currently proxied to each replica.")), []string{"replica"}),
		healthy:       prometheus.NewGaugeVec(prometheus.GaugeOpts(o("replica_healthy", "1 if the replica receives new requests.")), []string{"replica"}),
		scrapeErrors:  prometheus.NewCounterVec(prometheus.CounterOpts(o("scrape_errors_total", "Failed engine /metrics scrapes.")), []string{"replica"}),
		scrapeBig:     prometheus.NewCounterVec(prometheus.CounterOpts(o("scrape_body_too_large_total", "Engine /metrics scrapes refused for a body over scrape.body_size_limit (also in scrape_errors_total).")), []string{"replica"}),
		reloads:       prometheus.NewCounterVec(prometheus.CounterOpts(o("config_reloads_total", "Replica list reloads by result.")), []string{"result"}),
		rejected:      prometheus.NewCounterVec(prometheus.CounterOpts(o("rejected_total", "Requests refused before routing, by reason.")), []string{"reason"}),
	}
	m.promptTok = prometheus.NewCounterVec(prometheus.CounterOpts(o("prompt_tokens_total", "Prompt tokens the engine reported (usage.prompt_tokens), by model and replica.")), []string{"model", "replica"})
	m.outputTok = prometheus.NewCounterVec(prometheus.CounterOpts(o("output_tokens_total", "Output tokens the engine reported (usage.completion_tokens), by model and replica.")), []string{"model", "replica"})
	m.itl = prometheus.NewHistogramVec(h("inter_token_latency_seconds", "Mean time between output tokens of a streamed response: (last byte - first token) / (completion_tokens - 1), one sample per response that reported at least 2 completion tokens.", itlBuckets), []string{"model"})
	m.holds = prometheus.NewCounterVec(prometheus.CounterOpts(o("slot_holds_total", "Waits at the router for a busy batch slot holding the request's prompt (routing.slot_hold), by outcome: woken (a request ended, the request decided again), expired (the slot did not free when predicted: decided again without waiting) or client_gone (the client left: nothing sent).")), []string{"outcome"})
	m.holdTime = prometheus.NewHistogram(h("slot_hold_seconds", "Time a request waited at the router for busy batch slots holding its prompt, in all, one sample per request that waited (included in ttft_seconds).", latencyBuckets))
	reg.MustRegister(m.promptTok, m.outputTok, m.itl, m.holds, m.holdTime)
	m.ops = newOpsMetrics(reg)
	reg.MustRegister(m.requests, m.decision, m.predicted, m.actual, m.predictionErr, m.ttft, m.e2e,
		m.retries, m.ejections, m.broken, m.clientGone, m.timeouts, m.inFlight, m.replicaFlight, m.healthy, m.scrapeErrors, m.scrapeBig, m.reloads, m.rejected)
	return m
}

// localRequest counts a request answered by the router itself (no replica).
func (m *metrics) localRequest(code int) {
	if code < 100 || code >= 600 {
		code = 599
	}
	p := m.local[code].Load()
	if p == nil {
		c := m.requests.WithLabelValues("", "none", strconv.Itoa(code))
		p = &c
		m.local[code].Store(p)
	}
	(*p).Inc()
}

// replicaMetrics are the per-replica children, resolved once when the
// replica is added and deleted when it is removed.
type replicaMetrics struct {
	predicted, actual, retries, ejections, broken, scrapeErrors prometheus.Counter
	clientGone, timeouts, scrapeBig                             prometheus.Counter
	inFlight, healthy                                           prometheus.Gauge
	models                                                      []modelMetrics
}

// modelMetrics are the per (replica, model) children.
type modelMetrics struct {
	name      []byte
	ttft, e2e prometheus.Observer
	itl       prometheus.Observer
	promptTok prometheus.Counter
	outputTok prometheus.Counter
	codes     [600]atomic.Pointer[prometheus.Counter]
	m         *metrics
	replica   string
}

func (mm *modelMetrics) request(code int) {
	if code < 100 || code >= 600 {
		code = 599
	}
	p := mm.codes[code].Load()
	if p == nil {
		c := mm.m.requests.WithLabelValues(string(mm.name), mm.replica, strconv.Itoa(code))
		p = &c
		mm.codes[code].Store(p)
	}
	(*p).Inc()
}

func (m *metrics) forReplica(name string, models []string) replicaMetrics {
	rm := replicaMetrics{
		predicted:    m.predicted.WithLabelValues(name),
		actual:       m.actual.WithLabelValues(name),
		retries:      m.retries.WithLabelValues(name),
		ejections:    m.ejections.WithLabelValues(name),
		broken:       m.broken.WithLabelValues(name),
		clientGone:   m.clientGone.WithLabelValues(name),
		timeouts:     m.timeouts.WithLabelValues(name),
		scrapeBig:    m.scrapeBig.WithLabelValues(name),
		scrapeErrors: m.scrapeErrors.WithLabelValues(name),
		inFlight:     m.replicaFlight.WithLabelValues(name),
		healthy:      m.healthy.WithLabelValues(name),
	}
	rm.models = make([]modelMetrics, len(models))
	for i, mod := range models {
		rm.models[i] = modelMetrics{name: []byte(mod), ttft: m.ttft.WithLabelValues(mod), e2e: m.e2e.WithLabelValues(mod), m: m, replica: name,
			itl: m.itl.WithLabelValues(mod), promptTok: m.promptTok.WithLabelValues(mod, name), outputTok: m.outputTok.WithLabelValues(mod, name)}
	}
	return rm
}

// forgetReplica deletes a removed replica's series.
func (m *metrics) forgetReplica(name string) {
	for _, v := range []*prometheus.CounterVec{m.predicted, m.actual, m.retries, m.ejections, m.broken, m.clientGone, m.timeouts, m.scrapeErrors, m.scrapeBig} {
		v.DeleteLabelValues(name)
	}
	m.replicaFlight.DeleteLabelValues(name)
	m.healthy.DeleteLabelValues(name)
	m.requests.DeletePartialMatch(prometheus.Labels{"replica": name})
	m.promptTok.DeletePartialMatch(prometheus.Labels{"replica": name})
	m.outputTok.DeletePartialMatch(prometheus.Labels{"replica": name})
}

// tenantMetrics are the tenants block's collectors (registered whether or
// not it is on: they stay empty).
type tenantMetrics struct {
	queueLen       *prometheus.GaugeVec     // class
	queueWait      *prometheus.HistogramVec // class
	shed           *prometheus.CounterVec   // class, tenant, reason
	budgetRejected *prometheus.CounterVec   // tenant, limit
	keyReloads     *prometheus.CounterVec   // result
}

func newTenantMetrics(reg prometheus.Registerer) *tenantMetrics {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: name, Help: help}
	}
	m := &tenantMetrics{
		queueLen: prometheus.NewGaugeVec(prometheus.GaugeOpts(o("queue_length", "Requests waiting in the fair queue, by priority class.")), []string{"class"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "queue_wait_seconds",
			Help: "Time requests served from the fair queue waited in it, by priority class.", Buckets: latencyBuckets}, []string{"class"}),
		shed:           prometheus.NewCounterVec(prometheus.CounterOpts(o("queue_shed_total", "Requests the fair queue shed, by class, tenant and reason (queue_full, tenant_share: 429; timeout: 503; client_gone: left while queued).")), []string{"class", "tenant", "reason"}),
		budgetRejected: prometheus.NewCounterVec(prometheus.CounterOpts(o("tenant_budget_rejected_total", "Requests refused with 429 for a tenant over a budget, by tenant and limit.")), []string{"tenant", "limit"}),
		keyReloads:     prometheus.NewCounterVec(prometheus.CounterOpts(o("keys_reloads_total", "Keys file reloads by result (ok, error).")), []string{"result"}),
	}
	reg.MustRegister(m.queueLen, m.queueWait, m.shed, m.budgetRejected, m.keyReloads)
	return m
}
