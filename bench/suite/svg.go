package suite

import (
	"fmt"
	"io"
	"math"
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

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
	"#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8"}

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
	for i := 0; i <= 5; i++ {
		if len(p.XTicks) == 0 {
			fx := xmin + (xmax-xmin)*float64(i)/5
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(fx), top+ph+16, num(fx))
		}
		fy := ymin + (ymax-ymin)*float64(i)/5
		yv := fy
		if p.LogY {
			yv = math.Pow(10, fy)
		}
		y := top + ph - float64(i)/5*ph
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, left+pw, y, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, num(yv))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", left+pw/2, H-10, esc(p.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16,%.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, esc(p.YLabel))
	for si, s := range p.Series {
		col := palette[si%len(palette)]
		var pts []string
		for i := range s.X {
			if math.IsNaN(s.Y[i]) || math.IsInf(s.Y[i], 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[i]), py(s.Y[i])))
		}
		width := 1.5
		if si == 0 {
			width = 3 // the first series is warmpath's
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>`+"\n", col, width, strings.Join(pts, " "))
		ly := top + 10 + float64(si)*16
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="%.1f"/>`, left+pw+10, left+pw+30, ly, ly, col, width)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", left+pw+36, ly+4, esc(s.Name))
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
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return fmt.Sprintf("%.1f", v)
	case a >= 0.01:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.1e", v)
	}
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
