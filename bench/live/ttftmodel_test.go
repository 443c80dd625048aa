package live

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseTTFTModel(t *testing.T) {
	text := `# HELP warmpath_affinity_ttft_prediction_ratio x
warmpath_affinity_ttft_prediction_ratio_bucket{replica="a",le="0.5"} 1
warmpath_affinity_ttft_prediction_ratio_bucket{replica="a",le="1.25"} 6
warmpath_affinity_ttft_prediction_ratio_bucket{replica="a",le="2"} 8
warmpath_affinity_ttft_prediction_ratio_bucket{replica="a",le="+Inf"} 10
warmpath_affinity_ttft_prediction_ratio_bucket{replica="b",le="0.5"} 0
warmpath_affinity_ttft_prediction_ratio_bucket{replica="b",le="1.25"} 4
warmpath_affinity_ttft_prediction_ratio_bucket{replica="b",le="2"} 9
warmpath_affinity_ttft_prediction_ratio_bucket{replica="b",le="+Inf"} 10
warmpath_affinity_ttft_prediction_ratio_sum{replica="b"} 12
`
	got, err := parseTTFTModel(text)
	if err != nil {
		t.Fatal(err)
	}
	// 20 checked; cumulative 1, 10, 17, 20: the median falls in (0.5, 1.25],
	// the 90th percentile (18) past 2.
	if got.Checked != 20 || got.P50 != 1.25 || got.P90 != -1 || fmtRatio(got.P90) != "> 8" {
		t.Fatalf("%+v", got)
	}
	if _, err := parseTTFTModel("go_goroutines 3\n"); err == nil {
		t.Fatal("no histogram: want an error")
	}
}

// Rounds' histograms pool bucket by bucket: two rounds whose medians sit
// in different buckets have a pooled median set by the larger round.
func TestTTFTModelMerge(t *testing.T) {
	hist := func(lo, hi int) string {
		return "warmpath_affinity_ttft_prediction_ratio_bucket{le=\"0.8\"} " + itoa(lo) + "\n" +
			"warmpath_affinity_ttft_prediction_ratio_bucket{le=\"2\"} " + itoa(lo+hi) + "\n" +
			"warmpath_affinity_ttft_prediction_ratio_bucket{le=\"+Inf\"} " + itoa(lo+hi) + "\n"
	}
	a, err := parseTTFTModel(hist(9, 1)) // median 0.8
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseTTFTModel(hist(2, 28)) // median 2
	if err != nil {
		t.Fatal(err)
	}
	m := a.merge(b)
	if a.P50 != 0.8 || b.P50 != 2 || m.Checked != 40 || m.P50 != 2 || m.P90 != 2 {
		t.Fatalf("a %+v b %+v merged %+v", a, b, m)
	}
	if got := (TTFTModelError{}).merge(a); got.Checked != 10 || got.P50 != 0.8 {
		t.Fatalf("empty merged with a: %+v", got)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// The exact error comes from the access log: warm-up lines skipped, lines
// without a prediction or not requests ignored, quantiles by nearest rank,
// a request's wait for a slot hold left out, and a line the router
// writes late (its queue) still counted.
func TestTTFTErrorFromLog(t *testing.T) {
	line := func(ttft, pred float64) string {
		return fmt.Sprintf(`{"time":"x","level":"INFO","msg":"request","status":200,"ttft_ms":%g,"predicted_ttft_ms":%g}`+"\n", ttft, pred)
	}
	var b strings.Builder
	b.WriteString(line(1000, 1)) // warm-up: a ratio of 1000, skipped
	b.WriteString(line(1000, 1))
	b.WriteString(`{"msg":"reloaded"}` + "\n")
	for _, r := range []float64{0.5, 0.8, 1, 1.1, 1.2, 1.25, 1.5, 2} {
		b.WriteString(line(100*r, 100))
	}
	// Held 1 s at the router before the decision that predicted 100 ms:
	// a ratio of 1, not 11.
	b.WriteString(`{"msg":"request","status":200,"ttft_ms":1100,"predicted_ttft_ms":100,"held_ms":1000}` + "\n")
	b.WriteString(`{"msg":"request","status":200,"ttft_ms":5,"predicted_ttft_ms":0}` + "\n") // buffered: no prediction
	b.WriteString(`{"msg":"request","status":502,"ttft_ms":0,"predicted_ttft_ms":40}` + "\n")
	path := filepath.Join(t.TempDir(), "row.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// The last line comes late, as from the router's writer goroutine.
	go func() {
		time.Sleep(100 * time.Millisecond)
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			f.WriteString(line(400, 100)) // ratio 4
			f.Close()
		}
	}()
	m, err := ttftErrorFromLog(path, 2, 14)
	if err != nil {
		t.Fatal(err)
	}
	// ratios 0.5 0.8 1 1 1.1 1.2 1.25 1.5 2 4: p10 the 1st, p50 the 5th,
	// p90 the 9th; |errors| 1 1 1.1 1.2 1.25 1.25 1.5 2 2 4: p50 1.25, p90 2.
	if !m.Exact || m.Checked != 10 || m.P10 != 0.5 || m.P50 != 1.1 || m.P90 != 2 || m.AbsP50 != 1.25 || math.Abs(m.AbsP90-2) > 1e-12 {
		t.Fatalf("%+v", m)
	}
	// Rounds pool their ratios.
	// Pooled: 0.5 0.8, twelve 1s, 1.1 1.2 1.25 1.5 2 4: p50 the 10th, p90 the 18th.
	m2 := summarizeRatios([]float64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	if p := m.merge(m2); !p.Exact || p.Checked != 20 || p.P50 != 1 || p.P90 != 1.5 || len(m.ratios) != 10 {
		t.Fatalf("merged %+v", p)
	}
	if _, err := ttftErrorFromLog(filepath.Join(t.TempDir(), "none.jsonl"), 0, 1); err == nil {
		t.Fatal("no log: want an error")
	}
	// A log that holds only the warm-up when first read: its measured
	// lines, written late, are still what it reports.
	late := filepath.Join(t.TempDir(), "late.jsonl")
	if err := os.WriteFile(late, []byte(line(1000, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		f, err := os.OpenFile(late, os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			f.WriteString(line(150, 100) + line(50, 100))
			f.Close()
		}
	}()
	if m, err := ttftErrorFromLog(late, 1, 3); err != nil || m.Checked != 2 || m.P90 != 1.5 {
		t.Fatalf("late measured lines: %+v, %v", m, err)
	}
}
