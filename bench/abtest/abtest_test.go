package abtest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestAlternateOrderAndWarmup(t *testing.T) {
	var ran []string
	got, err := Alternate(4, 1, func(side, round int) (int, error) {
		ran = append(ran, string(rune('A'+side)))
		return 10*round + side, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"A", "B", "B", "A", "A", "B", "B", "A"}; !slices.Equal(ran, want) {
		t.Errorf("ran %v, want ABBA order %v", ran, want)
	}
	if !slices.Equal(got[0], []int{10, 20, 30}) || !slices.Equal(got[1], []int{11, 21, 31}) {
		t.Errorf("results %v: want rounds 1..3 of each side, warm-up dropped", got)
	}
}

func TestAlternateStopsAtError(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	_, err := Alternate(3, 0, func(side, round int) (int, error) {
		calls++
		if round == 1 {
			return 0, boom
		}
		return 0, nil
	})
	if !errors.Is(err, boom) || calls != 3 {
		t.Fatalf("err %v after %d calls, want boom after 3", err, calls)
	}
}

func TestAlternateNeedsCountedRounds(t *testing.T) {
	if _, err := Alternate(1, 1, func(int, int) (int, error) { return 0, nil }); err == nil {
		t.Fatal("no error when every round is warm-up")
	}
}

func TestNamedReportsEachRun(t *testing.T) {
	var out strings.Builder
	n := Naming{What: "idle", Sides: [2]string{"ours", "theirs"}, Progress: &out}
	got, err := Named(n, 2, func(side, round int) (int, error) { return 10*round + side, nil },
		func(side, round, v int) string { return fmt.Sprintf("round %d %s %d", round, n.Sides[side], v) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[0], []int{0, 10}) || !slices.Equal(got[1], []int{1, 11}) {
		t.Errorf("results %v: want both rounds of each side", got)
	}
	if want := "round 0 ours 0\nround 0 theirs 1\nround 1 theirs 11\nround 1 ours 10\n"; out.String() != want {
		t.Errorf("progress %q, want %q", out.String(), want)
	}
}

func TestNamedNamesTheFailure(t *testing.T) {
	boom := errors.New("boom")
	lines := 0
	_, err := Named(Naming{What: "idle", Sides: [2]string{"ours", "theirs"}}, 2, func(side, round int) (int, error) {
		if round == 1 && side == 1 {
			return 0, boom
		}
		return 0, nil
	}, func(int, int, int) string { lines++; return "" })
	if !errors.Is(err, boom) || err.Error() != "idle, theirs, round 1: boom" {
		t.Errorf("err %v, want boom named", err)
	}
	if lines != 0 {
		t.Errorf("%d lines made without a progress writer", lines)
	}
}

func TestMedians(t *testing.T) {
	runs := [2][]int{{3, 1, 2}, {10, 40}}
	a, b := Medians(runs, func(v int) float64 { return float64(v) })
	if a != 2 || b != 25 {
		t.Errorf("Medians %v %v, want 2 and 25", a, b)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(c.in)
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("Median reordered its input: %v", c.in)
		}
	}
}

func TestRoundRatio(t *testing.T) {
	// Per-round ratios 2, 4, 3: their median is 3, while the ratio of the
	// medians is 12/5. The fourth value of a has no partner and is ignored.
	if got := RoundRatio([]float64{10, 40, 12, 99}, []float64{5, 10, 4}); got != 3 {
		t.Errorf("RoundRatio = %v, want 3", got)
	}
}

func TestSpread(t *testing.T) {
	if lo, hi := Spread([]float64{3, 1, 2}); lo != 1 || hi != 3 {
		t.Errorf("Spread = %v–%v, want 1–3", lo, hi)
	}
	if lo, hi := Spread[float64](nil); lo != 0 || hi != 0 {
		t.Errorf("Spread(nil) = %v–%v", lo, hi)
	}
	if r := RoundRatios([]float64{10, 40}, []float64{5, 10, 4}); !slices.Equal(r, []float64{2, 4}) {
		t.Errorf("RoundRatios = %v", r)
	}
}
