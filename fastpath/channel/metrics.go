package channel

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the channel relay's Prometheus series. No label holds a host
// name, token or channel id: labels are bounded enumerations only.
type Metrics struct {
	claims     *prometheus.CounterVec
	refused    *prometheus.CounterVec
	malformed  prometheus.Counter
	toComputer prometheus.Counter
	toPhone    prometheus.Counter
	computers  prometheus.Gauge
	phones     prometheus.Gauge
}

// NewMetrics creates the series and registers them with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_channel_claims_total", Help: "POST /claim answers by outcome.",
		}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_channel_upgrades_refused_total", Help: "WebSocket upgrades refused after authentication, by reason.",
		}, []string{"reason"}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_channel_malformed_control_frames_total", Help: "Control sockets closed for a malformed frame.",
		}),
		toComputer: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_channel_frames_to_computer_total", Help: "Phone frames forwarded to computers.",
		}),
		toPhone: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_channel_frames_to_phone_total", Help: "Computer frames forwarded to phones.",
		}),
		computers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgerelay_channel_control_sockets", Help: "Open control sockets.",
		}),
		phones: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgerelay_channel_phone_channels", Help: "Open phone channels.",
		}),
	}
	// Every outcome's series exists from the start, at zero, so that rate()
	// and alerts work before the first event.
	for _, o := range []string{"claimed", "no_bearer", "too_large", "bad_body", "unknown_key", "used", "token_in_use"} {
		m.claims.WithLabelValues(o)
	}
	for _, r := range []string{"control_open", "computer_offline", "too_many_phones"} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.claims, m.refused, m.malformed, m.toComputer, m.toPhone, m.computers, m.phones)
	}
	return m
}
