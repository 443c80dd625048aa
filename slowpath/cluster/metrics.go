package cluster

import "github.com/prometheus/client_golang/prometheus"

// Drop reasons. Updates: overflow (the pending batch was full), disconnected
// (NATS down: not queued), unknown_replica (a peer named a replica this
// instance does not have). Batches: decode, mismatch (hash configuration
// differs), stale (send time more than max_age from receive time, either
// way), subject (published on a subject not its instance's), publish (NATS
// refused it), and gap (batches of a peer never received, from its
// sequence numbers).
const (
	dropOverflow     = "overflow"
	dropDisconnected = "disconnected"
	dropUnknown      = "unknown_replica"
	dropDecode       = "decode"
	dropMismatch     = "mismatch"
	dropStale        = "stale"
	dropPublish      = "publish"
	dropGap          = "gap"
	dropSubject      = "subject"
	dropRateLimited  = "rate_limited"
)

type metrics struct {
	sent, received   [recKinds]prometheus.Counter // by record kind
	updDropped       map[string]prometheus.Counter
	batchDropped     map[string]prometheus.Counter
	batchesSent      prometheus.Counter
	batchesReceived  prometheus.Counter
	bytesSent        prometheus.Counter
	bytesReceived    prometheus.Counter
	lag              prometheus.Histogram
	peers            prometheus.Gauge
	connected        prometheus.Gauge
	snapshotSent     prometheus.Counter
	snapshotImported prometheus.Counter
	natsErrors       prometheus.Counter
	cs               []prometheus.Collector
}

func newMetrics() *metrics {
	const ns, sub = "warmpath", "cluster"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, []string{label})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	sent := counterVec("updates_sent_total", "Updates published to peers, by kind.", "kind")
	recv := counterVec("updates_received_total", "Updates received from peers and applied, by kind.", "kind")
	ud := counterVec("updates_dropped_total", "Updates not sent or not applied, by reason (overflow, disconnected, unknown_replica).", "reason")
	bd := counterVec("batches_dropped_total", "Batches not applied (decode, mismatch: hash config or duplicate instance name, stale, subject), not published (publish), never received (gap), or snapshot requests not answered (rate_limited).", "reason")
	m := &metrics{
		updDropped:       map[string]prometheus.Counter{},
		batchDropped:     map[string]prometheus.Counter{},
		batchesSent:      counter("batches_sent_total", "Batches published (heartbeats included)."),
		batchesReceived:  counter("batches_received_total", "Batches received from peers (before any drop)."),
		bytesSent:        counter("sent_bytes_total", "Bytes of batches and snapshot chunks published."),
		bytesReceived:    counter("received_bytes_total", "Bytes of batches and snapshot chunks received."),
		snapshotSent:     counter("snapshot_blocks_sent_total", "Index blocks sent to warming-up peers."),
		snapshotImported: counter("snapshot_blocks_imported_total", "Index blocks imported from peers' snapshots at start."),
		natsErrors:       counter("nats_errors_total", "Asynchronous NATS client errors (slow consumer, permissions, auth) and unexpected connection closes."),
		peers:            gauge("peers_seen", "Peers heard from within peer_timeout."),
		connected:        gauge("connected", "1 while connected to NATS, else 0 (routing then uses local state only)."),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "apply_lag_seconds",
			Help:    "From a batch's send time (sender's clock) to its apply here.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
	}
	for k := byte(1); k < recKinds; k++ {
		m.sent[k] = sent.WithLabelValues(recordKind(k).String())
		m.received[k] = recv.WithLabelValues(recordKind(k).String())
	}
	for _, r := range []string{dropOverflow, dropDisconnected, dropUnknown} {
		m.updDropped[r] = ud.WithLabelValues(r)
	}
	for _, r := range []string{dropDecode, dropMismatch, dropStale, dropPublish, dropGap, dropSubject, dropRateLimited} {
		m.batchDropped[r] = bd.WithLabelValues(r)
	}
	m.cs = []prometheus.Collector{sent, recv, ud, bd, m.batchesSent, m.batchesReceived, m.bytesSent, m.bytesReceived,
		m.lag, m.peers, m.connected, m.snapshotSent, m.snapshotImported, m.natsErrors}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range m.cs {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
