package suite

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestNiceTicksAreRound(t *testing.T) {
	for _, tc := range []struct{ lo, hi float64 }{{0.2, 1.1}, {0, 0.973}, {0.013, 7.9}, {3, 1024}, {-0.4, 0.4}} {
		ts := niceTicks(tc.lo, tc.hi, 6)
		if len(ts) < 3 || len(ts) > 12 || ts[0] > tc.lo || ts[len(ts)-1] < tc.hi {
			t.Fatalf("[%v, %v]: ticks %v do not cover it in 3..12 steps", tc.lo, tc.hi, ts)
		}
		step := ts[1] - ts[0]
		m := step / math.Pow(10, math.Floor(math.Log10(step)+1e-9))
		if math.Abs(m-1) > 1e-6 && math.Abs(m-2) > 1e-6 && math.Abs(m-5) > 1e-6 {
			t.Errorf("[%v, %v]: step %v is not 1, 2 or 5 x 10^k", tc.lo, tc.hi, step)
		}
		for _, v := range ts {
			if s := num(v); len(s) > 6 {
				t.Errorf("tick %v printed %q", v, s)
			}
		}
	}
	for _, v := range logTicks(math.Log10(0.013), math.Log10(40)) {
		s := num(v)
		if !strings.HasPrefix(strings.TrimLeft(s, "0."), "1") && !strings.HasPrefix(strings.TrimLeft(s, "0."), "2") && !strings.HasPrefix(strings.TrimLeft(s, "0."), "5") {
			t.Errorf("log tick %v (%q) is not 1, 2 or 5 x 10^k", v, s)
		}
	}
}

// TestPlotSeriesDistinctAndCostOnTop: 12 series get 12 distinct
// colour/dash pairs; the first (cost) is drawn last, thickest, with
// markers; given ticks label the x axis as they say (replica counts).
func TestPlotSeriesDistinctAndCostOnTop(t *testing.T) {
	pl := Plot{Title: "t", XLabel: "replicas", YLabel: "s", LogY: true}
	for i := range 12 {
		pl.Series = append(pl.Series, Series{Name: fmt.Sprintf("p%d", i), X: []float64{2, 4, 6}, Y: []float64{0.1 * float64(i+1), 0.2, 0.3}})
	}
	for _, n := range []int{4, 16, 64} {
		pl.XTicks = append(pl.XTicks, Tick{At: math.Log2(float64(n)), Label: fmt.Sprint(n)})
	}
	seen := map[string]bool{}
	for i := range 12 {
		k := palette[i] + "/" + dashes[i]
		if seen[k] || seen[palette[i]] {
			t.Fatalf("series %d repeats %s", i, k)
		}
		seen[k], seen[palette[i]] = true, true
	}
	var b strings.Builder
	if err := pl.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	lines := strings.Split(svg, "\n")
	last := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "<polyline") {
			last = l
		}
	}
	if !strings.Contains(last, palette[0]) || !strings.Contains(last, `stroke-width="3.5"`) {
		t.Errorf("last polyline is not cost's thick red line: %s", last)
	}
	if !strings.Contains(svg, "<circle") {
		t.Error("cost's points are not marked")
	}
	for _, want := range []string{">4<", ">16<", ">64<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("x axis lacks label %s", want)
		}
	}
}
