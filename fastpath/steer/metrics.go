package steer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/affinity"
)

// metrics: namespace warmpath, subsystem steer. Children resolved once.
type metrics struct {
	actions                      *prometheus.CounterVec
	promote, move, drop          prometheus.Counter
	drops                        *prometheus.CounterVec
	idle, inelig, sat, stale     prometheus.Counter
	bumps                        prometheus.Counter
	errors                       *prometheus.CounterVec
	errWrite, errDelete, errSync prometheus.Counter
	entries                      prometheus.Gauge
}

func newMetrics() metrics {
	var m metrics
	m.actions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "steer",
		Name: "actions_total", Help: "Affinity entries written (promote, move) or deleted (drop) by the promotion rule."}, []string{"action"})
	m.promote = m.actions.WithLabelValues("promote")
	m.move = m.actions.WithLabelValues("move")
	m.drop = m.actions.WithLabelValues("drop")
	m.drops = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "steer",
		Name: "rebalance_drops_total", Help: "Affinity entries deleted by the control loop, by reason."}, []string{"reason"})
	m.idle = m.drops.WithLabelValues("idle")
	m.inelig = m.drops.WithLabelValues("ineligible")
	m.sat = m.drops.WithLabelValues("saturated")
	m.stale = m.drops.WithLabelValues("stale")
	m.bumps = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "steer",
		Name: "generation_bumps_total", Help: "Backends whose generation was bumped (host unhealthy or removed)."})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "steer",
		Name: "errors_total", Help: "Failed datapath operations, by operation."}, []string{"op"})
	m.errWrite = m.errors.WithLabelValues("write")
	m.errDelete = m.errors.WithLabelValues("delete")
	m.errSync = m.errors.WithLabelValues("sync")
	m.entries = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "warmpath", Subsystem: "steer",
		Name: "entries", Help: "Clients with an affinity entry after the last control-loop step."})
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.actions, m.drops, m.bumps, m.errors, m.entries} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) action(a affinity.Action) prometheus.Counter {
	switch a {
	case affinity.ActionPromote:
		return m.promote
	case affinity.ActionMove:
		return m.move
	}
	return m.drop
}

func (m *metrics) rebalance(reason string) prometheus.Counter {
	switch reason {
	case "idle":
		return m.idle
	case "ineligible":
		return m.inelig
	case "saturated":
		return m.sat
	}
	return m.stale
}
