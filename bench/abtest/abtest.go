// Package abtest runs two contenders against each other the way every
// comparison in `make bench` does: alternately, round by round, in ABBA
// order, with warm-up rounds dropped, summarised by medians.
//
// The order matters on a shared machine. Run A's rounds first and B's
// after, and any drift (thermal state, another tenant, the garbage
// collector's pacing, a disk's write cache filling) falls on one side
// only; alternate, and it falls on both alike. ABBA rather than ABAB so
// that neither side always runs right after the other has warmed (or
// heated) the machine.
package abtest

import (
	"fmt"
	"io"
	"slices"
)

// Alternate runs measure rounds times for each of two sides, side 0 (A)
// and side 1 (B): A then B in even rounds, B then A in odd ones. The first
// warmup rounds run but are not returned: they fill caches, pools and
// connection sets. It returns each side's results in round order and
// stops at the first error.
func Alternate[T any](rounds, warmup int, measure func(side, round int) (T, error)) ([2][]T, error) {
	var out [2][]T
	if rounds <= warmup {
		return out, fmt.Errorf("abtest: %d rounds with %d of warm-up leaves none to count", rounds, warmup)
	}
	for round := range rounds {
		order := [2]int{0, 1}
		if round%2 == 1 {
			order = [2]int{1, 0}
		}
		for _, side := range order {
			v, err := measure(side, round)
			if err != nil {
				return out, err
			}
			if round >= warmup {
				out[side] = append(out[side], v)
			}
		}
	}
	return out, nil
}

// Naming is how Named names a comparison's sides in its errors and its
// progress.
type Naming struct {
	// What is what is measured: an error reads "What, side, round 2: …".
	What string
	// Sides are the two sides' names, side 0's first.
	Sides [2]string
	// Progress, when not nil, gets one line per result.
	Progress io.Writer
}

// Named is Alternate (no warm-up: each round a fresh server) with the
// sides named: measure's error is wrapped with what it was measuring, and
// each result is written to n.Progress as the line that line makes of it
// (without its newline), as the runs go, so that a long comparison shows
// where it is.
func Named[T any](n Naming, rounds int, measure func(side, round int) (T, error), line func(side, round int, v T) string) ([2][]T, error) {
	return Alternate(rounds, 0, func(side, round int) (T, error) {
		v, err := measure(side, round)
		if err != nil {
			return v, fmt.Errorf("%s, %s, round %d: %w", n.What, n.Sides[side], round, err)
		}
		if n.Progress != nil {
			fmt.Fprintln(n.Progress, line(side, round, v))
		}
		return v, nil
	})
}

// Medians are the medians of f over each side's runs, side 0's first.
func Medians[R any](runs [2][]R, f func(R) float64) (a, b float64) {
	return Median(Values(runs[0], f)), Median(Values(runs[1], f))
}

// Median is the middle value (the mean of the two middle ones for an even
// count), or zero for none. v is not reordered.
func Median[T ~int64 | ~float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// RoundRatio is the median over rounds of a[i] / b[i]. The two sides of
// one round ran back to back, so this shrugs off a machine whose speed
// drifts between rounds better than Median(a) / Median(b) does. Rounds
// beyond the shorter slice are ignored.
func RoundRatio(a, b []float64) float64 { return Median(RoundRatios(a, b)) }

// RoundRatios are the rounds' a[i] / b[i], for RoundRatio and its spread.
func RoundRatios(a, b []float64) []float64 {
	n := min(len(a), len(b))
	r := make([]float64, n)
	for i := range n {
		r[i] = a[i] / b[i]
	}
	return r
}

// Spread is the smallest and the largest of v (zeros for none): with the
// median, what a report gives of a figure measured over several rounds.
func Spread[T ~int64 | ~float64](v []T) (lo, hi T) {
	if len(v) == 0 {
		return 0, 0
	}
	return slices.Min(v), slices.Max(v)
}

// Values is f of each run, in order: one figure of every round, for
// Median, RoundRatios and Spread.
func Values[R any](runs []R, f func(R) float64) []float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	return v
}
