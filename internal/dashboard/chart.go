package dashboard

import (
	"html/template"
	"strconv"
	"strings"

	"github.com/llmq/llmq/internal/metrics"
)

// Charts are inline SVG polylines: no script, no library.

const (
	chartW, chartH, chartPad = 300.0, 64.0, 3.0
)

// line is one series of a chart; Class is a CSS class (ok, bad, alt, muted).
type line struct {
	Name, Class string
	Values      []float64
}

type legendItem struct{ Name, Class, Total string }

type chart struct {
	Title    string
	Legend   []legendItem
	SVG      template.HTML
	Max      string
	From, To string
}

func newChart(title, unit string, ms []metrics.Minute, lines []line) chart {
	c := chart{Title: title}
	if len(ms) > 0 {
		c.From, c.To = ms[0].Start.Format("15:04"), ms[len(ms)-1].Start.Format("15:04")
	}
	top := 0.0
	for _, l := range lines {
		for _, v := range l.Values {
			top = max(top, v)
		}
		c.Legend = append(c.Legend, legendItem{Name: l.Name, Class: l.Class, Total: format(unit, sum(l.Values))})
	}
	c.Max = format(unit, top)

	var b strings.Builder
	b.WriteString(`<svg class="spark" viewBox="0 0 300 64" preserveAspectRatio="none" role="img" aria-label="`)
	b.WriteString(template.HTMLEscapeString(title))
	b.WriteString(`"><line class="axis" x1="0" y1="61" x2="300" y2="61"/>`)
	for _, l := range lines {
		if len(l.Values) == 0 {
			continue
		}
		b.WriteString(`<polyline class="l-` + l.Class + `" points="`)
		step := chartW / float64(max(len(l.Values)-1, 1))
		for i, v := range l.Values {
			y := chartH - chartPad
			if top > 0 {
				y -= v / top * (chartH - 2*chartPad)
			}
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.FormatFloat(float64(i)*step, 'f', 1, 64))
			b.WriteByte(',')
			b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
		}
		b.WriteString(`"/>`)
	}
	b.WriteString(`</svg>`)
	// Only numbers and the escaped title went in.
	c.SVG = template.HTML(b.String())
	return c
}

func format(unit string, v float64) string {
	if unit == "usd" {
		return usd(v)
	}
	return group(int64(v + 0.5))
}
