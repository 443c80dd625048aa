package suite

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a plot.
type Series struct {
	Name string
	X, Y []float64
}

// Plot is a minimal line chart rendered as standalone SVG: no dependencies,
// readable in any browser and on GitHub.
type Plot struct {
	Title, XLabel, YLabel string
	LogY                  bool
	Series                []Series
	// XTicks, when set, label the x axis at these positions (categories or
	// a log scale) instead of six evenly spaced numbers.
	XTicks []Tick
}

// Tick is a labelled position on an axis.
type Tick struct {
	At    float64
	Label string
}

// palette gives 12 series 12 distinct colours (Tableau 10 plus black and
// olive) and dashes: neighbouring colours also differ in line style, so
// no two series look alike. Series 0 (warmpath's cost) is red, solid,
// thick, marked and drawn last, on top of the rest.
var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
	"#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#6b6b00"}

var dashes = []string{"", "6,3", "2,2", "8,3,2,3", "", "6,3", "2,2", "8,3,2,3", "4,4", "", "2,2", "8,3,2,3"}

// niceTicks returns round tick values (steps of 1, 2 or 5 times a power
// of ten) from at or below lo to at or above hi, about n of them.
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		return []float64{lo}
	}
	raw := (hi - lo) / float64(max(n-1, 1))
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for k := math.Floor(lo/step + 1e-9); k <= math.Ceil(hi/step-1e-9); k++ {
		out = append(out, k*step)
	}
	return out
}

// logTicks returns round values (1, 2, 5 x 10^k) between 10^lo and 10^hi
// (exponents), dropping the 2s and 5s when the range spans many decades.
func logTicks(lo, hi float64) []float64 {
	mults := []float64{1, 2, 5}
	if hi-lo > 3 {
		mults = []float64{1}
	}
	var out []float64
	for k := math.Floor(lo); k <= math.Ceil(hi); k++ {
		for _, m := range mults {
			v := m * math.Pow(10, k)
			if lv := math.Log10(v); lv >= lo-1e-9 && lv <= hi+1e-9 {
				out = append(out, v)
			}
		}
	}
	if len(out) < 3 { // about a decade wide or less: linear round steps within it
		out = nil
		for _, v := range niceTicks(math.Pow(10, lo), math.Pow(10, hi), 5) {
			if v > 0 {
				out = append(out, v)
			}
		}
	}
	return out
}

// WriteSVG renders p.
func (p *Plot) WriteSVG(w io.Writer) error {
	const W, H, left, right, top, bottom = 760.0, 420.0, 70.0, 210.0, 40.0, 50.0
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	ty := func(y float64) float64 {
		if p.LogY {
			return math.Log10(math.Max(y, 1e-6))
		}
		return y
	}
	for _, s := range p.Series {
		for i := range s.X {
			if math.IsNaN(s.Y[i]) || math.IsInf(s.Y[i], 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, ty(s.Y[i])), math.Max(ymax, ty(s.Y[i]))
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	for _, t := range p.XTicks {
		xmin, xmax = math.Min(xmin, t.At), math.Max(xmax, t.At)
	}
	if !p.LogY {
		ymin = math.Min(ymin, 0)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax == ymin {
		ymax = ymin + 1
	}
	// widen the axes to round values
	var yticks []float64
	if p.LogY {
		ymin, ymax = math.Floor(ymin*10)/10, math.Ceil(ymax*10)/10
		yticks = logTicks(ymin, ymax)
	} else {
		yticks = niceTicks(ymin, ymax, 6)
		ymin, ymax = math.Min(ymin, yticks[0]), math.Max(ymax, yticks[len(yticks)-1])
	}
	var xticks []float64
	if len(p.XTicks) == 0 {
		xticks = niceTicks(xmin, xmax, 6)
		xmin, xmax = math.Min(xmin, xticks[0]), math.Max(xmax, xticks[len(xticks)-1])
	}
	pw, ph := W-left-right, H-top-bottom
	px := func(x float64) float64 { return left + (x-xmin)/(xmax-xmin)*pw }
	py := func(y float64) float64 { return top + ph - (ty(y)-ymin)/(ymax-ymin)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(p.Title))
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", left, top, pw, ph)
	for _, t := range p.XTicks {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(t.At), top+ph+16, esc(t.Label))
	}
	for _, fx := range xticks {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(fx), top+ph+16, num(fx))
	}
	for _, yv := range yticks {
		y := py(yv)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, left+pw, y, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, num(yv))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", left+pw/2, H-10, esc(p.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16,%.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, esc(p.YLabel))
	// the first series (warmpath's) is drawn last, on top, thick and marked
	for k := range p.Series {
		si := (k + 1) % len(p.Series)
		s := p.Series[si]
		col, dash := palette[si%len(palette)], dashes[si%len(dashes)]
		var pts []string
		for i := range s.X {
			if math.IsNaN(s.Y[i]) || math.IsInf(s.Y[i], 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[i]), py(s.Y[i])))
		}
		width, style := 1.6, ""
		if dash != "" {
			style = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
		}
		if si == 0 {
			width = 3.5
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n", col, width, style, strings.Join(pts, " "))
		if si == 0 {
			for _, pt := range pts {
				x, y, _ := strings.Cut(pt, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="4" fill="%s"/>`, x, y, col)
			}
			b.WriteString("\n")
		}
		ly := top + 10 + float64(si)*16
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="%.1f"%s/>`, left+pw+10, left+pw+34, ly, ly, col, width, style)
		weight := ""
		if si == 0 {
			weight = ` font-weight="bold"`
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f"%s>%s</text>`+"\n", left+pw+40, ly+4, weight, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 1e6 || a < 1e-4:
		return fmt.Sprintf("%.0e", v)
	}
	// the shortest of up to 4 decimals that shows v (round ticks: 0.05, 2, 250)
	return strconv.FormatFloat(math.Round(v*1e4)/1e4, 'f', -1, 64)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
