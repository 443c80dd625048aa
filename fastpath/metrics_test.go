package fastpath

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

var update = flag.Bool("update", false, "rewrite golden files")

// countingDP is a userspace Datapath with fixed counters, posing as kernel.
type countingDP struct {
	*Userspace
	c   Counters
	err error
}

func (d *countingDP) Mode() Mode                  { return ModeKernel }
func (d *countingDP) Counters() (Counters, error) { return d.c, d.err }

func fixedCounters() Counters {
	var c Counters
	c.Global[PassNotService] = Counter{Packets: 10, Bytes: 640}
	c.Global[Steered] = Counter{Packets: 5, Bytes: 500}
	c.Global[ErrFIB] = Counter{Packets: 1, Bytes: 74}
	c.Backends = []BackendCounters{{ID: 2, Steered: Counter{5, 500}, SYN: Counter{2, 148}, Sampled: Counter{1, 74}}}
	return c
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run with -update after checking):\n%s", name, got)
	}
}

func gatherText(t *testing.T, c prometheus.Collector) []byte {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestCollectorGolden(t *testing.T) {
	dp := &countingDP{Userspace: NewUserspace(nil), c: fixedCounters()}
	golden(t, "metrics.golden", gatherText(t, NewCollector(dp)))
}

func TestCollectorUserspaceAndErrors(t *testing.T) {
	out := string(gatherText(t, NewCollector(NewUserspace(nil))))
	if !strings.Contains(out, "warmpath_fastpath_kernel_mode 0") || !strings.Contains(out, `warmpath_fastpath_packets_total{kind="steered"} 0`) {
		t.Errorf("userspace metrics:\n%s", out)
	}
	dp := &countingDP{Userspace: NewUserspace(nil), err: errors.New("boom")}
	out = string(gatherText(t, NewCollector(dp)))
	if !strings.Contains(out, "warmpath_fastpath_scrape_error 1") || strings.Contains(out, "packets_total") {
		t.Errorf("failed read should export scrape_error 1 and no counters:\n%s", out)
	}
}

func TestWriteStatusGolden(t *testing.T) {
	clk := &fakeClock{ns: int64(time.Hour)}
	dp := &countingDP{Userspace: NewUserspace(clk.now), c: fixedCounters()}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dp.SetServices([]Service{netip.MustParseAddrPort("10.100.0.1:8000")}))
	must(dp.SetBackends([]Backend{
		{ID: 2, Addr: netip.MustParseAddr("10.2.0.2"), Healthy: true, Generation: 4, SampleEvery: 100},
		{ID: 3, Addr: netip.MustParseAddr("10.2.0.3"), Healthy: false, Generation: 1},
	}))
	must(dp.SetAffinity(Affinity{Client: netip.MustParseAddr("10.1.0.2"), Service: netip.MustParseAddrPort("10.100.0.1:8000"), Backend: 2, Generation: 4}))
	clk.ns += int64(1500 * time.Millisecond)
	var buf bytes.Buffer
	must(WriteStatus(&buf, dp))
	golden(t, "status.golden", buf.Bytes())
}
