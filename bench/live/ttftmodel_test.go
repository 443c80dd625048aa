package live

import (
	"strconv"
	"testing"
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
