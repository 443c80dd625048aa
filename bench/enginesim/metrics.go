package enginesim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ttftBuckets are vLLM's buckets for vllm:time_to_first_token_seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// e2eBuckets are vLLM's buckets for vllm:e2e_request_latency_seconds.
var e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// metrics are one server's Prometheus series in its private registry. The
// vllm:* names match vLLM's so a router scraping vLLM scrapes us; values
// are model time (what the GPU would see), not wall time.
type metrics struct {
	reg      *prometheus.Registry
	ttft     prometheus.Observer
	e2e      prometheus.Observer
	stop     prometheus.Counter
	length   prometheus.Counter
	restarts prometheus.Counter
	faults   *prometheus.CounterVec
	fault    map[string]prometheus.Counter // children of faults, by kind
}

func newMetrics(s *Server) *metrics {
	model := prometheus.Labels{"model_name": s.base}
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg}
	stats := func(f func(EngineStats) float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			st := s.eng.Stats()
			s.mu.Unlock()
			return f(st)
		}
	}
	gauge := func(name, help string, f func(EngineStats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: model}, stats(f)))
	}
	// Engine counters restart from zero with the engine, as a real vLLM
	// process's do: the router detects a restart by a counter going
	// backwards (Stats keeps the cumulative totals for tests).
	counter := func(name, help string, f func(EngineStats) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: model}, func() float64 {
			s.mu.Lock()
			st, base := s.eng.Stats(), s.metBase
			s.mu.Unlock()
			return f(st) - f(base)
		}))
	}
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func(st EngineStats) float64 { return float64(st.Waiting) })
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func(st EngineStats) float64 { return float64(st.Running) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
		func(st EngineStats) float64 { return st.KVUsage() })
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
		func(st EngineStats) float64 { return float64(st.PrefixQueries) })
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
		func(st EngineStats) float64 { return float64(st.PrefixHits) })
	counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.",
		func(st EngineStats) float64 { return float64(st.Preemptions) })
	counter("vllm:prompt_tokens_total", "Number of prefill tokens processed (cache misses).",
		func(st EngineStats) float64 { return float64(st.PromptTokens) })
	counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
		func(st EngineStats) float64 { return float64(st.GenerationTokens) })

	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"model_name":            s.base,
			"block_size":            strconv.Itoa(s.cfg.BlockSize),
			"num_gpu_blocks":        strconv.Itoa(s.cfg.NumGPUBlocks),
			"enable_prefix_caching": pyBool(!s.cfg.DisablePrefixCaching),
		}})
	info.Set(1)
	reg.MustRegister(info)

	ttft := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds (model time).", Buckets: ttftBuckets, ConstLabels: model})
	e2e := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
		Help: "Histogram of end to end request latency in seconds (model time).", Buckets: e2eBuckets, ConstLabels: model})
	success := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: model}, []string{"finished_reason"})
	m.faults = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "enginesim",
		Name: "faults_injected_total", Help: "Faults injected, by kind.", ConstLabels: model}, []string{"kind"})
	m.restarts = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "enginesim",
		Name: "restarts_total", Help: "Simulated engine restarts (KV cache wiped).", ConstLabels: model})
	reg.MustRegister(ttft, e2e, success, m.faults, m.restarts)
	m.ttft, m.e2e = ttft, e2e
	m.stop = success.WithLabelValues("stop")
	m.length = success.WithLabelValues("length")
	m.fault = map[string]prometheus.Counter{}
	for _, k := range faultKinds {
		m.fault[k] = m.faults.WithLabelValues(k)
	}
	return m
}

var faultKinds = []string{"error", "hang", "latency", "close", "stall", "metrics_garbage", "metrics_stall"}

func (m *metrics) finished(r *Request, at int64) {
	m.e2e.Observe(time.Duration(at - r.Arrival).Seconds())
	switch r.Finish {
	case FinishStop:
		m.stop.Inc()
	case FinishLength:
		m.length.Inc()
	}
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}
