package store

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Commit failure reasons, the values of the reason label of
// edgerelay_store_commit_errors_total.
const (
	// commitRefused: the store refused the write before Pebble saw it
	// (free space below the reserve, a stall, Pebble failed earlier).
	commitRefused = "refused"
	// commitFailed: Pebble returned an error, or failed, during the
	// commit: the disk or the database is in trouble.
	commitFailed = "failed"
)

// storeMetrics are the store's write series. They exist from Open, so
// that Commit records into them whether or not a registry ever collects
// them (a command that opens the store registers none).
type storeMetrics struct {
	commitSeconds prometheus.Histogram
	commitErrors  *prometheus.CounterVec
	// Resolved once: a commit does no label lookup.
	refused, failed prometheus.Counter
}

// commitBuckets cover a synced commit from a fast NVMe fsync (~100 µs)
// to the 2 s after which the store calls itself stuck (stuckAfter).
var commitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5}

func newStoreMetrics() *storeMetrics {
	m := &storeMetrics{
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgerelay_store_commit_seconds",
			Help:    "Time of each synced commit to Pebble (write-ahead log fsynced, group commits shared), successful or not; refused writes are not timed.",
			Buckets: commitBuckets,
		}),
		commitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_store_commit_errors_total",
			Help: "Writes not made: reason=refused when the store refused them before Pebble (see edgerelay_store_writes_refused), failed when Pebble returned an error or failed during the commit.",
		}, []string{"reason"}),
	}
	// Both series exist at zero from the start, for rate() and alerts.
	m.refused = m.commitErrors.WithLabelValues(commitRefused)
	m.failed = m.commitErrors.WithLabelValues(commitFailed)
	return m
}

// commitDone records one commit that went to Pebble.
func (m *storeMetrics) commitDone(took time.Duration, err error) {
	m.commitSeconds.Observe(took.Seconds())
	if err != nil {
		m.failed.Inc()
	}
}

// RegisterMetrics adds the store's write series to reg:
// edgerelay_store_commit_seconds (histogram) and
// edgerelay_store_commit_errors_total{reason}. The process registers them
// once; a second registration on the same registry is an error.
func (db *DB) RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{db.metrics.commitSeconds, db.metrics.commitErrors} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("store: register metrics: %w", err)
		}
	}
	return nil
}
