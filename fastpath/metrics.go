package fastpath

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a Datapath's counters as Prometheus metrics, read at
// scrape time (namespace warmpath, subsystem fastpath):
//
//	warmpath_fastpath_packets_total{kind}           counter
//	warmpath_fastpath_bytes_total{kind}             counter
//	warmpath_fastpath_backend_packets_total{backend,kind}  counter (kind: steered, syn, sampled)
//	warmpath_fastpath_backend_bytes_total{backend,kind}    counter
//	warmpath_fastpath_kernel_mode                   gauge: 1 kernel, 0 userspace
//
// kind is a CounterKind name (pass_local, steered, err_fib, ...).
type Collector struct {
	dp                     Datapath
	packets, bytes         *prometheus.Desc
	bePackets, beBytes     *prometheus.Desc
	kernelMode, scrapeErrs *prometheus.Desc
}

// NewCollector returns a Collector for dp. Register it once.
func NewCollector(dp Datapath) *Collector {
	fq := func(name string) string { return prometheus.BuildFQName("warmpath", "fastpath", name) }
	return &Collector{
		dp:         dp,
		packets:    prometheus.NewDesc(fq("packets_total"), "Packets seen by the XDP datapath, by outcome.", []string{"kind"}, nil),
		bytes:      prometheus.NewDesc(fq("bytes_total"), "Bytes (frame length as received) seen by the XDP datapath, by outcome.", []string{"kind"}, nil),
		bePackets:  prometheus.NewDesc(fq("backend_packets_total"), "Per-backend packets: steered, SYNs with a valid affinity, SYNs sampled to the slowpath.", []string{"backend", "kind"}, nil),
		beBytes:    prometheus.NewDesc(fq("backend_bytes_total"), "Per-backend bytes, as backend_packets_total.", []string{"backend", "kind"}, nil),
		kernelMode: prometheus.NewDesc(fq("kernel_mode"), "1 when the XDP datapath is active, 0 in userspace fallback mode.", nil, nil),
		scrapeErrs: prometheus.NewDesc(fq("scrape_error"), "1 when the last counter read failed.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.bePackets, c.beBytes, c.kernelMode, c.scrapeErrs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; it reads the counters once.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	mode := 0.0
	if c.dp.Mode() == ModeKernel {
		mode = 1
	}
	ch <- prometheus.MustNewConstMetric(c.kernelMode, prometheus.GaugeValue, mode)
	cs, err := c.dp.Counters()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.scrapeErrs, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeErrs, prometheus.GaugeValue, 0)
	for k := range NumCounterKinds {
		name := k.String()
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(cs.Global[k].Packets), name)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(cs.Global[k].Bytes), name)
	}
	for _, b := range cs.Backends {
		id := strconv.FormatUint(uint64(b.ID), 10)
		for _, kv := range [...]struct {
			kind string
			c    Counter
		}{{"steered", b.Steered}, {"syn", b.SYN}, {"sampled", b.Sampled}} {
			ch <- prometheus.MustNewConstMetric(c.bePackets, prometheus.CounterValue, float64(kv.c.Packets), id, kv.kind)
			ch <- prometheus.MustNewConstMetric(c.beBytes, prometheus.CounterValue, float64(kv.c.Bytes), id, kv.kind)
		}
	}
}

var _ prometheus.Collector = (*Collector)(nil)
