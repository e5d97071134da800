package pushgw

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the gateway's Prometheus series, shared by the mounts of a
// process (each series has a mount label). Labels are bounded
// enumerations: no key id, token or address.
type Metrics struct {
	answers       *prometheus.CounterVec
	sends         *prometheus.CounterVec
	refunds       *prometheus.CounterVec
	registrations *prometheus.CounterVec
}

// Send outcomes, the values of the outcome label of sends_total.
const (
	sendOK = iota
	sendStale
	sendFailed
	sendErrored
	sendRateLimited
	sendClaimRefused
	sendBudgetExhausted
	numSendOutcomes
)

var sendOutcomeNames = [numSendOutcomes]string{"ok", "stale", "provider_failed", "error", "rate_limited", "token_claimed", "budget_exhausted"}

// Registration outcomes.
const (
	regCreated = iota
	regDisabled
	regNoAddress
	regRateLimited
	regTooLarge
	numRegOutcomes
)

var regOutcomeNames = [numRegOutcomes]string{"created", "disabled", "no_address", "rate_limited", "too_large"}

// answerCodes are the statuses the gateway answers with; their series
// exist from the start and are looked up without locking.
var answerCodes = []int{200, 201, 400, 401, 403, 404, 408, 410, 413, 429, 431, 500, 502, 503}

// NewMetrics creates the series and registers them with reg (nil:
// unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_push_gateway_answers_total", Help: "Push-gateway answers by mount, route and status.",
		}, []string{"mount", "route", "code"}),
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_push_gateway_sends_total", Help: "POST /send outcomes past validation, by mount.",
		}, []string{"mount", "outcome"}),
		refunds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_push_gateway_budget_refunds_total", Help: "Daily-budget draws refunded because the provider was never contacted.",
		}, []string{"mount"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_push_gateway_registrations_total", Help: "POST /register outcomes by mount.",
		}, []string{"mount", "outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.answers, m.sends, m.refunds, m.registrations)
	}
	return m
}

// mountMetrics are one mount's series, resolved once.
type mountMetrics struct {
	vec           *prometheus.CounterVec
	mount         string
	answers       [numRoutes]map[int]prometheus.Counter // read-only after mount()
	sends         [numSendOutcomes]prometheus.Counter
	refunds       prometheus.Counter
	registrations [numRegOutcomes]prometheus.Counter
}

func (m *Metrics) mount(name string) *mountMetrics {
	mm := &mountMetrics{vec: m.answers, mount: name, refunds: m.refunds.WithLabelValues(name)}
	for r := range numRoutes {
		mm.answers[r] = make(map[int]prometheus.Counter, len(answerCodes))
		for _, c := range answerCodes {
			mm.answers[r][c] = m.answers.WithLabelValues(name, r.String(), strconv.Itoa(c))
		}
	}
	for i, n := range sendOutcomeNames {
		mm.sends[i] = m.sends.WithLabelValues(name, n)
	}
	for i, n := range regOutcomeNames {
		mm.registrations[i] = m.registrations.WithLabelValues(name, n)
	}
	return mm
}

func (mm *mountMetrics) answer(r route, status int) {
	if c, ok := mm.answers[r][status]; ok {
		c.Inc()
		return
	}
	mm.vec.WithLabelValues(mm.mount, r.String(), strconv.Itoa(status)).Inc()
}
