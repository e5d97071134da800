// Package promtest reads Prometheus series back in tests: the value of one
// counter or gauge, found by name and labels, from what a registry gathers.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Value returns the value of the counter or gauge name whose labels are
// exactly labels (nil: no labels), and whether there is one.
func Value(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	tb.Helper()
	families, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; !ok || v != lp.GetValue() {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// Must is Value for a series that must exist: its absence fails tb.
func Must(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	v, ok := Value(tb, g, name, labels)
	if !ok {
		tb.Fatalf("no series %s%v", name, labels)
	}
	return v
}
