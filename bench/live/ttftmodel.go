package live

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TTFTModelError summarises warmpath's warmpath_affinity_ttft_prediction_ratio
// histogram (measured / predicted TTFT of streamed requests, every replica
// summed): how many predictions were checked and the ratio's median and
// 90th percentile, each read as the upper bound of the bucket it falls in
// (-1 past the last finite bound, 8: JSON has no +Inf).
type TTFTModelError struct {
	Checked  uint64
	P50, P90 float64

	cum map[float64]float64 // cumulative count per bucket bound, for merge
}

// merge pools two histograms' buckets (rows of several rounds).
func (e TTFTModelError) merge(o TTFTModelError) TTFTModelError {
	if len(o.cum) == 0 {
		return e
	}
	if len(e.cum) == 0 {
		return o
	}
	cum := make(map[float64]float64, len(e.cum))
	for b, n := range e.cum {
		cum[b] = n
	}
	for b, n := range o.cum {
		cum[b] += n
	}
	return summarizeRatio(cum)
}

const ttftRatioMetric = "warmpath_affinity_ttft_prediction_ratio_bucket"

// scrapeRouter reads warmpath's admin /metrics: the TTFT model's error and
// how evenly it spread the row's requests (replicaImbalance).
func scrapeRouter(ctx context.Context, url string) (TTFTModelError, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return TTFTModelError{}, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return TTFTModelError{}, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return TTFTModelError{}, 0, err
	}
	text := string(body)
	m, err := parseTTFTModel(text)
	return m, replicaImbalance(text), err
}

// replicaImbalance is the busiest replica's share of the routed requests
// over the mean share (warmpath_slowpath_requests_total summed per replica over
// models and codes): 1 is an even spread, N all on one of N replicas; 0
// when nothing was routed.
func replicaImbalance(text string) float64 {
	per := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "warmpath_slowpath_requests_total{") {
			continue
		}
		i := strings.Index(line, `replica="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < i {
			continue
		}
		name := line[i+len(`replica="`):]
		name = name[:strings.IndexByte(name, '"')]
		n, err := strconv.ParseFloat(strings.TrimSpace(line[j+1:]), 64)
		if err != nil || name == "none" {
			continue
		}
		per[name] += n
	}
	total, most := 0.0, 0.0
	for _, n := range per {
		total += n
		most = max(most, n)
	}
	if total == 0 {
		return 0
	}
	return most / (total / float64(len(per)))
}

// parseTTFTModel sums the histogram's cumulative buckets over replicas.
func parseTTFTModel(text string) (TTFTModelError, error) {
	cum := map[float64]float64{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, ttftRatioMetric+"{") {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < i {
			continue
		}
		le := line[i+4:]
		le = le[:strings.IndexByte(le, '"')]
		bound, err1 := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		n, err2 := strconv.ParseFloat(strings.TrimSpace(line[j+1:]), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		cum[bound] += n
	}
	if len(cum) == 0 {
		return TTFTModelError{}, fmt.Errorf("no %s in the metrics", ttftRatioMetric)
	}
	return summarizeRatio(cum), nil
}

// summarizeRatio reads the count and quantiles off cumulative buckets.
func summarizeRatio(cum map[float64]float64) TTFTModelError {
	bounds := make([]float64, 0, len(cum))
	for b := range cum {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	total := cum[bounds[len(bounds)-1]]
	out := TTFTModelError{Checked: uint64(total), cum: cum}
	q := func(p float64) float64 {
		for _, b := range bounds {
			if cum[b] >= p*total {
				if math.IsInf(b, 1) {
					return -1
				}
				return b
			}
		}
		return -1
	}
	if total > 0 {
		out.P50, out.P90 = q(0.5), q(0.9)
	}
	return out
}

// fmtRatio prints a TTFTModelError quantile.
func fmtRatio(r float64) string {
	if r < 0 {
		return "> 8"
	}
	return strconv.FormatFloat(r, 'g', 3, 64)
}

// saveURL writes the body of a GET of url (at most 16 MiB) to path.
func saveURL(ctx context.Context, url, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}
