package netlimit

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// PromMetrics holds the listener metrics of one Prometheus registry. Every
// service's listener shares it: a metric name can be registered only once
// per registry, so the refusal counter is one CounterVec with a service
// label, and each service gets its own view of it through For.
type PromMetrics struct {
	reg     prometheus.Registerer
	refused *prometheus.CounterVec
}

// NewPromMetrics registers edgerelay_listener_refused_total{service,reason}
// with reg. If reg already has that counter (a second PromMetrics on the same
// registry), it is shared rather than reported as an error.
func NewPromMetrics(reg prometheus.Registerer) (*PromMetrics, error) {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgerelay_listener_refused_total",
		Help: "Connections closed before the server saw them: right after accept because a listener limit was reached " +
			"(reason total: max connections, per_ip: max connections per IP, rate: accept rate, " +
			"fds: the process had no file descriptor left), or after waiting parked for a first byte " +
			"that did not come within the header timeout (reason silent).",
	}, []string{"service", "reason"})
	if err := reg.Register(refused); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return nil, fmt.Errorf("netlimit: register refused counter: %w", err)
		}
		existing, ok := already.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, fmt.Errorf("netlimit: register refused counter: %w", err)
		}
		refused = existing
	}
	return &PromMetrics{reg: reg, refused: refused}, nil
}

// For returns the Counters of one service. The reasons' series are
// created at once, at zero, so that rate() and alerts work before the first
// refusal; no label ever carries a client IP, which would let clients grow
// the series without bound.
func (m *PromMetrics) For(service string) Counters {
	return &promCounters{
		service: service,
		vec:     m.refused,
		total:   m.refused.WithLabelValues(service, ReasonTotal),
		perIP:   m.refused.WithLabelValues(service, ReasonPerIP),
		rate:    m.refused.WithLabelValues(service, ReasonRate),
		fds:     m.refused.WithLabelValues(service, ReasonFDs),
		silent:  m.refused.WithLabelValues(service, ReasonSilent),
	}
}

// TrackOpen registers edgerelay_listener_open_connections{service}, a gauge
// read from l.Open at scrape time, and
// edgerelay_listener_waiting_connections{service}, read from l.Waiting
// (connections parked until their first byte, 0 without SetParker). A
// service can be tracked once per registry; a second call for the same
// service returns an error.
func (m *PromMetrics) TrackOpen(service string, l *Listener) error {
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "edgerelay_listener_open_connections",
		Help:        "Connections accepted by a listener and not yet closed (those waiting for their first byte included).",
		ConstLabels: prometheus.Labels{"service": service},
	}, func() float64 { return float64(l.Open()) })
	if err := m.reg.Register(open); err != nil {
		return fmt.Errorf("netlimit: register open connections gauge for %q: %w", service, err)
	}
	waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "edgerelay_listener_waiting_connections",
		Help:        "Connections accepted by a listener and parked, without a goroutine, until their first byte arrives.",
		ConstLabels: prometheus.Labels{"service": service},
	}, func() float64 { return float64(l.Waiting()) })
	if err := m.reg.Register(waiting); err != nil {
		m.reg.Unregister(open)
		return fmt.Errorf("netlimit: register waiting connections gauge for %q: %w", service, err)
	}
	return nil
}

// promCounters is one service's view of the refusal counter, with the known
// reasons resolved in advance so that a refusal is a single atomic add.
type promCounters struct {
	service            string
	vec                *prometheus.CounterVec
	total, perIP, rate prometheus.Counter
	fds, silent        prometheus.Counter
}

func (c *promCounters) Refused(reason string) {
	switch reason {
	case ReasonTotal:
		c.total.Inc()
	case ReasonPerIP:
		c.perIP.Inc()
	case ReasonRate:
		c.rate.Inc()
	case ReasonFDs:
		c.fds.Inc()
	case ReasonSilent:
		c.silent.Inc()
	default:
		c.vec.WithLabelValues(c.service, reason).Inc()
	}
}
