package benchfmt

import (
	"math"
	"testing"
)

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Thousands(0), "0"},
		{Thousands(999), "999"},
		{Thousands(1234567.4), "1,234,567"},
		{Thousands(-1500), "-1,500"},
		{Thousands(math.NaN()), "—"},
		{Times(2.5), "2.50×"},
		{Times(math.Inf(1)), "—"},
		{Verdict("≥ 3×", true), "≥ 3× — met"},
		{Verdict("≥ 3×", false), "≥ 3× — **not met**"},
		{Rate(115167, []float64{141402, 78510, 115167}), "115,167 [78,510–141,402]"},
		{Rate(5, []float64{5}), "5"},
		{RoundRatio(2.38, []float64{2.9, 2.1, 2.38}, 2.63), "2.38× [2.10–2.90×] (ratio of the medians 2.63×)"},
		{RoundRatio(2.38, nil, 2.63), "2.38× (ratio of the medians 2.63×)"},
		{Nanoseconds(88), "88.0 ns"},
		{Nanoseconds(1110), "1.11 µs"},
		{Nanoseconds(2.44e6), "2.44 ms"},
		{Row{"a|b", "1", "2", "3", "4\n5"}.Markdown(), `| a\|b | 1 | 2 | 3 | 4 5 |`},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
