package mailbox

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/store"
)

// Metrics are the mailbox relay's Prometheus series; no label holds a
// mailbox id, app-independent counts only.
type Metrics struct {
	envelopesStored  prometheus.Counter
	mailboxesCreated prometheus.Counter
	mailboxesExpired prometheus.Counter
	rateLimited      prometheus.Counter
	watchers         prometheus.Gauge
	signalSockets    prometheus.Gauge
	signalFrames     prometheus.Counter
	pushes           *prometheus.CounterVec
	// slowClosed counts sockets closed with 1013 for falling behind,
	// by socket kind; slowWatch and slowSignal are its two series.
	slowClosed            *prometheus.CounterVec
	slowWatch, slowSignal prometheus.Counter
	// stats is the store's figures, read at scrape time (the series are
	// created before the handler and its store; nil: the store keeps no
	// caches to report).
	stats atomic.Pointer[store.MailboxStatsReporter]
}

// storeStats reads the store's figures (zero without a reporter).
func (m *Metrics) storeStats() store.MailboxStats {
	if r := m.stats.Load(); r != nil {
		return (*r).MailboxStats()
	}
	return store.MailboxStats{}
}

// NewMetrics creates the series and registers them with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		envelopesStored:  prometheus.NewCounter(prometheus.CounterOpts{Name: "edgerelay_mailbox_envelopes_stored_total", Help: "Envelopes stored (201)."}),
		mailboxesCreated: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgerelay_mailbox_created_total", Help: "Mailboxes created by a claim."}),
		mailboxesExpired: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgerelay_mailbox_expired_total", Help: "Mailboxes erased by idle expiry."}),
		rateLimited:      prometheus.NewCounter(prometheus.CounterOpts{Name: "edgerelay_mailbox_rate_limited_total", Help: "Requests answered 429 rate_limited."}),
		watchers:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgerelay_mailbox_watch_sockets", Help: "Open watch sockets."}),
		signalSockets:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgerelay_mailbox_signal_sockets", Help: "Open signal sockets."}),
		signalFrames:     prometheus.NewCounter(prometheus.CounterOpts{Name: "edgerelay_mailbox_signal_frames_total", Help: "Signal frames forwarded."}),
		pushes:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgerelay_mailbox_pushes_total", Help: "Push wake-ups by outcome."}, []string{"outcome"}),
		slowClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgerelay_mailbox_slow_sockets_closed_total",
			Help: "Sockets closed with 1013 for falling behind: socket=watch when its send queue filled (RELAY_MAX_BEHIND) or the store's delivery left it behind, signal when its send queue filled."},
			[]string{"socket"}),
	}
	// Every series exists from the start, at zero, so that rate() and
	// alerts work before the first event.
	for _, o := range pushOutcomes {
		m.pushes.WithLabelValues(o)
	}
	m.slowWatch = m.slowClosed.WithLabelValues("watch")
	m.slowSignal = m.slowClosed.WithLabelValues("signal")
	// Hits and misses are plain counters; only the bytes held need a
	// walk of the envelope cache's slots, once per scrape.
	cacheHits := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "edgerelay_mailbox_envelope_cache_hits_total",
		Help: "Envelope reads (GET, HEAD, a retried PUT) answered from the envelope cache."},
		func() float64 { return float64(m.storeStats().EnvelopeHits) })
	cacheMisses := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "edgerelay_mailbox_envelope_cache_misses_total",
		Help: "Envelope reads that went to the store."},
		func() float64 { return float64(m.storeStats().EnvelopeMisses) })
	cacheBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgerelay_mailbox_envelope_cache_bytes",
		Help: "Envelope bytes the envelope cache holds (RELAY_ENVELOPE_CACHE bounds it)."},
		func() float64 { return float64(m.storeStats().EnvelopeBytes) })
	loaded := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "edgerelay_mailbox_loaded",
		Help: "Mailboxes held in memory (authorized ones only; bounded, quiet ones evicted)."},
		func() float64 { return float64(m.storeStats().Loaded) })
	if reg != nil {
		reg.MustRegister(m.envelopesStored, m.mailboxesCreated, m.mailboxesExpired, m.rateLimited, m.watchers, m.signalSockets, m.signalFrames, m.pushes,
			m.slowClosed, cacheHits, cacheMisses, cacheBytes, loaded)
	}
	return m
}

// pushOutcomes are the values of edgerelay_mailbox_pushes_total's outcome
// label: sent (the provider answered 200), refused (it answered another
// status), failed (no answer: transport error or timeout), stale_removed
// (a registration the provider called stale, deleted), and the wake-ups
// not sent: foreground, rate_limited, queue_full, unregistered,
// unopenable, no_module.
var pushOutcomes = []string{"sent", "refused", "failed", "stale_removed", "foreground", "rate_limited", "queue_full", "unregistered", "unopenable", "no_module"}
