// Package benchfmt is how the benchmark reports write their figures, so
// that every table of `make bench` (bench/results/latest.md, and the
// comparisons' own commands) reads alike: rates with thousands separated,
// ratios as "2.50×", a goal's verdict, and the spread of a figure
// measured over several rounds as the lowest and highest value in
// brackets after its median.
package benchfmt

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Row is one line of a report's table:
//
//	| figure | ours | baseline | ratio | goal |
type Row struct{ Figure, Ours, Baseline, Ratio, Goal string }

// Markdown is the row as a table line, its cells kept on one line with
// their pipes literal.
func (r Row) Markdown() string {
	return fmt.Sprintf("| %s | %s | %s | %s | %s |", cell(r.Figure), cell(r.Ours), cell(r.Baseline), cell(r.Ratio), cell(r.Goal))
}

func cell(s string) string { return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s) }

// Thousands is v rounded to a whole number with commas between thousands
// ("—" for NaN and infinities).
func Thousands(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	s := fmt.Sprintf("%.0f", math.Abs(v))
	var b strings.Builder
	if v <= -0.5 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Times is a ratio as "2.50×" ("—" for NaN and infinities).
func Times(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", r)
}

// Verdict is a goal and whether the figure met it.
func Verdict(goal string, met bool) string {
	if met {
		return goal + " — met"
	}
	return goal + " — **not met**"
}

// Spread is the lowest and highest of v in brackets, each written by f:
// " [lo–hi]", or "" for fewer than two values (nothing to spread).
func Spread(v []float64, f func(float64) string) string {
	if len(v) < 2 {
		return ""
	}
	return fmt.Sprintf(" [%s–%s]", f(slices.Min(v)), f(slices.Max(v)))
}

// RateSpread is Spread for rates: " [78,510–141,402]".
func RateSpread(v []float64) string { return Spread(v, Thousands) }

// RatioSpread is Spread for ratios: " [2.10–2.90×]".
func RatioSpread(v []float64) string {
	if len(v) < 2 {
		return ""
	}
	return fmt.Sprintf(" [%.2f–%.2f×]", slices.Min(v), slices.Max(v))
}

// Rate is a median rate and its spread: "115,167 [78,510–141,402]".
func Rate(median float64, v []float64) string { return Thousands(median) + RateSpread(v) }

// RoundRatio is the judged ratio of a comparison, the median of the
// per-round ratios with their spread, and the ratio of the medians beside
// it: "2.38× [2.10–2.90×] (ratio of the medians 2.63×)".
func RoundRatio(median float64, rounds []float64, ofMedians float64) string {
	return fmt.Sprintf("%s%s (ratio of the medians %s)", Times(median), RatioSpread(rounds), Times(ofMedians))
}

// Nanoseconds is a time per operation: "88.0 ns", "1.11 µs", "2.44 ms".
func Nanoseconds(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.2f µs", ns/1e3)
	default:
		return fmt.Sprintf("%.1f ns", ns)
	}
}
