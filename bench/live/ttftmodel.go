package live

import (
	"bufio"
	"context"
	"encoding/json"
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

// TTFTModelError is how far warmpath's TTFT predictions were from the TTFTs
// it measured (measured / predicted, streamed requests, every replica):
// how many predictions were checked, and the ratio's median and 90th
// percentile. Exact: read from the row's access log, the measured
// requests only (their predicted_ttft_ms and ttft_ms), with P10 and the
// error's size whichever way it misses (AbsP50, AbsP90: exp|ln ratio|, 1
// is exact, 1.25 a quarter over or a fifth under). Otherwise from the
// router's warmpath_affinity_ttft_prediction_ratio histogram (warm-up
// included), each quantile read as the upper bound of the bucket it falls
// in (-1 past the last finite bound, 8: JSON has no +Inf).
type TTFTModelError struct {
	Checked        uint64
	P50, P90       float64
	Exact          bool    `json:",omitempty"`
	P10            float64 `json:",omitempty"`
	AbsP50, AbsP90 float64 `json:",omitempty"`

	cum    map[float64]float64 // cumulative count per bucket bound, for merge
	ratios []float64           // Exact: every ratio, for merge
}

// merge pools two rows' predictions (rows of several rounds): their
// ratios when both are exact, else their histograms' buckets (both keep
// them: an exact row has its histogram too, when it was scraped).
func (e TTFTModelError) merge(o TTFTModelError) TTFTModelError {
	if o.Checked == 0 && len(o.cum) == 0 {
		return e
	}
	if e.Checked == 0 && len(e.cum) == 0 {
		return o
	}
	var cum map[float64]float64
	if len(e.cum) > 0 && len(o.cum) > 0 {
		cum = make(map[float64]float64, len(e.cum))
		for b, n := range e.cum {
			cum[b] = n
		}
		for b, n := range o.cum {
			cum[b] += n
		}
	}
	if e.Exact && o.Exact {
		out := summarizeRatios(append(slices.Clip(e.ratios), o.ratios...))
		out.cum = cum
		return out
	}
	if cum == nil { // one round had neither its log nor its histogram
		return TTFTModelError{}
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

// summarizeRatios is the exact TTFTModelError of measured / predicted
// ratios (all > 0).
func summarizeRatios(ratios []float64) TTFTModelError {
	out := TTFTModelError{Checked: uint64(len(ratios)), Exact: true, ratios: ratios}
	if len(ratios) == 0 {
		return out
	}
	r := slices.Sorted(slices.Values(ratios))
	abs := make([]float64, len(r))
	for i, x := range r {
		abs[i] = math.Exp(math.Abs(math.Log(x)))
	}
	slices.Sort(abs)
	out.P10, out.P50, out.P90 = quantile(r, 0.1), quantile(r, 0.5), quantile(r, 0.9)
	out.AbsP50, out.AbsP90 = quantile(abs, 0.5), quantile(abs, 0.9)
	return out
}

// quantile is the p-quantile of sorted x (nearest rank).
func quantile(x []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(x)))) - 1
	return x[min(max(i, 0), len(x)-1)]
}

// ttftErrorFromLog reads a row's access log (JSON lines, log.format json)
// for the TTFT model's error over its measured requests: the first skip
// request lines are the warm-up's (it finishes before the measured
// requests begin), and want is how many request lines the row makes in
// all. The router writes its lines from a queue, so the last ones may
// land just after the load generator has its answers: the log is read
// again until it has want lines, for at most two seconds. Requests
// without a prediction (buffered answers, a failure) are not checked.
func ttftErrorFromLog(path string, skip, want int) (TTFTModelError, error) {
	for deadline := time.Now().Add(2 * time.Second); ; {
		// Read again while lines are missing, whatever this read found:
		// a log still empty of measured requests is no answer yet.
		m, lines, err := readTTFTLog(path, skip)
		if lines >= want || time.Now().After(deadline) {
			return m, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readTTFTLog is one read of ttftErrorFromLog's log; lines counts its
// request lines, the skipped ones included.
func readTTFTLog(path string, skip int) (_ TTFTModelError, lines int, _ error) {
	f, err := os.Open(path)
	if err != nil {
		return TTFTModelError{}, 0, err
	}
	defer f.Close()
	var ratios []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Msg       string  `json:"msg"`
			Status    int     `json:"status"`
			TTFT      float64 `json:"ttft_ms"`
			Predicted float64 `json:"predicted_ttft_ms"`
			Held      float64 `json:"held_ms"` // before the decision the prediction was made at
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "request" {
			continue
		}
		if lines++; skip > 0 {
			skip--
			continue
		}
		if t := l.TTFT - l.Held; l.Status == 200 && t > 0 && l.Predicted > 0 {
			ratios = append(ratios, t/l.Predicted)
		}
	}
	if err := sc.Err(); err != nil {
		return TTFTModelError{}, lines, err
	}
	if len(ratios) == 0 {
		return TTFTModelError{}, lines, fmt.Errorf("%s: no request with a predicted TTFT", path)
	}
	return summarizeRatios(ratios), lines, nil
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
