package live

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
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

// scrapeTTFTModel reads the histogram from warmpath's admin /metrics.
func scrapeTTFTModel(ctx context.Context, url string) (TTFTModelError, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return TTFTModelError{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return TTFTModelError{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return TTFTModelError{}, err
	}
	return parseTTFTModel(string(body))
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
