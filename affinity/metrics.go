package affinity

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Router's counters and per-replica state to Prometheus
// (namespace warmpath, subsystem affinity). It reads Stats and Replicas at
// scrape time, so the hot path pays nothing beyond its atomic counters.
//
// A replica's health, its in-flight count and the predicted cached tokens
// are not exported here: the router in front of affinity owns those facts
// (its health checks and ejections decide health, its slots count in-flight
// requests, and it counts predictions beside the engine's reported hits) and
// exports them once (warmpath_slowpath_replica_healthy, _replica_in_flight,
// _cached_tokens_predicted_total).
type Collector struct {
	r *Router

	decisions, errors, mispredicts, rollbacks, evictions                          *prometheus.Desc
	turnsKept                                                                     *prometheus.Desc
	holdCopies                                                                    *prometheus.Desc
	promptTokens                                                                  *prometheus.Desc
	blocks, pairs, info, credit                                                   *prometheus.Desc
	pending, rate, cached, capacity, drain                                        *prometheus.Desc
	slots, suspect, riskShare, slotSec, ttftRatio, ttftPred, ttftAct, trust, busy *prometheus.Desc
	shape                                                                         *prometheus.Desc
}

// NewCollector returns a Collector for r; register it once.
func NewCollector(r *Router) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("warmpath", "affinity", name), help, labels, nil)
	}
	return &Collector{
		r:            r,
		decisions:    d("decisions_total", "Successful routing decisions."),
		errors:       d("decide_errors_total", "Decisions that found no replica, by reason.", "reason"),
		mispredicts:  d("mispredictions_total", "Engine-reported cached tokens below half the prediction."),
		rollbacks:    d("rollbacks_total", "Speculative index inserts undone after a failure before the first token."),
		evictions:    d("index_evictions_total", "(block, replica) pairs evicted by the per-replica LRU bound."),
		turnsKept:    d("turns_kept_total", "Chat turns the cost policy put back on their previous turn's replica (engines with per-slot caches) over a lower estimate elsewhere."),
		holdCopies:   d("hold_copies_total", "Slot holds the cost policy declined because waiting for a computed prefix had come to what computing another copy costs (engines with per-slot caches)."),
		promptTokens: d("prompt_tokens_total", "Estimated prompt tokens of begun requests."),
		blocks:       d("index_blocks", "Distinct block hashes tracked."),
		pairs:        d("index_pairs", "(block, replica) pairs tracked."),
		info:         d("info", "Active policy and hash path.", "policy", "hash_path"),
		credit:       d("continuation_credit_tokens", "Measured cached tokens beyond the index on requests continuing a finished prompt (a chat's previous answer)."),
		pending:      d("replica_pending_prefill_tokens", "Router-local uncached prompt tokens awaiting prefill.", "replica"),
		rate:         d("replica_prefill_tokens_per_second", "Measured prefill rate estimate.", "replica"),
		cached:       d("replica_index_blocks", "Blocks the index attributes to the replica.", "replica"),
		capacity:     d("replica_index_capacity_blocks", "The replica's index bound, in blocks.", "replica"),
		drain:        d("replica_draining", "1 if the replica is draining.", "replica"),
		slots:        d("replica_batch_slots", "Batch slots the cost policy assumes (configured, engine-reported or learned); 0 = unknown.", "replica"),
		suspect:      d("replica_suspected_batch_slots", "While batch_slots is 0: the running count a batch limit is suspected at (requests were seen waiting there); 0 = none.", "replica"),
		riskShare:    d("replica_slot_risk_share", "The share of a suspected batch limit's wait the cost policy prices: its pool's measured waits over the waits the limit predicted (0.5 until four requests met it).", "replica"),
		slotSec:      d("replica_slot_seconds", "Time a request holds a batch slot after its first token (its decode) alone on the engine, as priced: its own estimate drawn toward its pool's (D_r).", "replica"),
		ttftRatio:    d("ttft_prediction_ratio", "Measured / predicted time to first token of streamed requests (the TTFT model's error).", "replica"),
		ttftPred:     d("ttft_predicted_seconds_total", "Sum of predicted TTFTs over the requests in ttft_prediction_ratio.", "replica"),
		ttftAct:      d("ttft_measured_seconds_total", "Sum of measured TTFTs over the same requests.", "replica"),
		trust:        d("replica_prediction_confidence", "How far the cost policy trusts the replica's predicted cache hits: the recent share of predicted cached tokens the engine reported cached (0..1).", "replica"),
		busy:         d("replica_busy_cost_seconds", "Measured time to first token each request already on the replica adds to a new one's (its pool's fit; 0 until learned).", "replica"),
		shape:        d("replica_prefill_shape_seconds", "Where the engine reports its prefill timings and they depend on what a prefill extends: the seconds the cost policy prices per computed token (term=token), per attention pair (term=pair) and per cached token extended (term=context_token). Absent where the prefill is priced at its rate.", "replica", "term"),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.decisions, c.errors, c.mispredicts, c.rollbacks, c.evictions, c.turnsKept, c.holdCopies,
		c.promptTokens, c.blocks, c.pairs, c.info, c.credit,
		c.pending, c.rate, c.cached, c.capacity, c.drain,
		c.slots, c.suspect, c.riskShare, c.slotSec, c.ttftRatio, c.ttftPred, c.ttftAct, c.trust, c.busy, c.shape} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	cnt := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	cnt(c.decisions, s.Decisions)
	cnt(c.errors, s.ModelNotFound, "model_not_found")
	cnt(c.errors, s.NoReplica, "no_replica")
	cnt(c.mispredicts, s.Mispredictions)
	cnt(c.rollbacks, s.Rollbacks)
	cnt(c.evictions, s.Evictions)
	cnt(c.turnsKept, s.TurnsKept)
	cnt(c.holdCopies, s.HoldCopies)
	cnt(c.promptTokens, s.PromptTokens)
	gauge(c.blocks, float64(s.TrackedBlocks))
	gauge(c.pairs, float64(s.TrackedPairs))
	gauge(c.info, 1, c.r.PolicyName(), c.r.cfg.Hash.HashPath())
	gauge(c.credit, c.r.ContinuationCredit())
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, st := range c.r.Replicas() {
		gauge(c.pending, float64(st.PendingPrefillTokens), st.Name)
		gauge(c.rate, st.PrefillTokensPerSec, st.Name)
		gauge(c.cached, float64(st.CachedBlocks), st.Name)
		gauge(c.capacity, float64(st.CapacityBlocks), st.Name)
		gauge(c.drain, b2f(st.Draining), st.Name)
		gauge(c.slots, float64(st.BatchSlots), st.Name)
		gauge(c.suspect, float64(st.SuspectedBatchSlots), st.Name)
		gauge(c.riskShare, st.SlotRiskShare, st.Name)
		gauge(c.slotSec, st.SlotSeconds, st.Name)
		gauge(c.trust, st.Confidence, st.Name)
		gauge(c.busy, st.BusyCostSeconds, st.Name)
		if sh := st.PrefillShape; sh.Priced() {
			gauge(c.shape, sh.PerToken, st.Name, "token")
			gauge(c.shape, sh.PerPair, st.Name, "pair")
			gauge(c.shape, sh.PerContextToken, st.Name, "context_token")
		}
		t := &st.TTFT
		buckets := make(map[float64]uint64, len(t.RatioBuckets))
		for i, b := range TTFTRatioBuckets() {
			buckets[b] = t.RatioBuckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(c.ttftRatio, t.Checked, t.RatioSum, buckets, st.Name)
		cnt2 := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, st.Name)
		}
		cnt2(c.ttftPred, t.PredictedSeconds)
		cnt2(c.ttftAct, t.ActualSeconds)
	}
}

var _ prometheus.Collector = (*Collector)(nil)
