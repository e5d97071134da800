package agent

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the agent relay's Prometheus series. Labels are bounded
// enumerations only: never an instance id, account, session or token.
type Metrics struct {
	links       prometheus.Gauge
	attachments prometheus.Gauge
	toClient    prometheus.Counter
	toInstance  prometheus.Counter
	handshakes  *prometheus.CounterVec
	linkEnds    *prometheus.CounterVec
	refused     *prometheus.CounterVec
	redeems     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	slowClosed  *prometheus.CounterVec

	// Resolved once, so that the routing path does no label lookup.
	dropLinkMalformed, dropNoSession, dropUnknownSession, dropWrongInstance prometheus.Counter
	dropClientMalformed, dropOffline, dropTooLong, dropClientOverflow       prometheus.Counter
	slowClientQueue, slowClientInstance, slowClientLink                     prometheus.Counter
}

// Reasons a routed frame is dropped.
var dropReasons = []string{
	"link_malformed",   // a line from the instance failed validation
	"no_session",       // cargo from the instance without a session
	"unknown_session",  // cargo from the instance for a session nobody holds
	"wrong_instance",   // cargo from the instance naming another instance
	"client_malformed", // a client message failed validation
	"instance_offline", // a client frame while the instance has no link
	"too_long",         // a client frame that would exceed the line limit once spliced
	"client_overflow",  // a frame for a client whose queue was full (the client is closed)
}

// NewMetrics creates the series and registers them with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		links: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgerelay_agent_links", Help: "Instance links past the welcome.",
		}),
		attachments: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgerelay_agent_attachments", Help: "Attached client WebSockets.",
		}),
		toClient: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_agent_frames_to_client_total", Help: "Frames routed from instances to clients.",
		}),
		toInstance: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_agent_frames_to_instance_total", Help: "Frames routed from clients to instances.",
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_agent_handshakes_total", Help: "Instance link handshakes by outcome.",
		}, []string{"outcome"}),
		linkEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_agent_links_closed_total", Help: "Instance links ended, by reason.",
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_agent_upgrades_refused_total", Help: "Link and attach upgrades refused, by reason.",
		}, []string{"reason"}),
		redeems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_agent_pair_redeems_total", Help: "POST /v1/pair/redeem answers by outcome.",
		}, []string{"outcome"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_agent_frames_dropped_total", Help: "Frames dropped instead of routed, by reason.",
		}, []string{"reason"}),
		slowClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_agent_slow_clients_closed_total",
			Help: "Clients closed with 1013 for not reading: queue=client when its own send queue was full, queue=instance when the instance's clients together held InstanceQueue.",
		}, []string{"queue"}),
	}
	// Every series exists from the start, at zero, so that rate() and
	// alerts work before the first event.
	for _, o := range handshakeOutcomes {
		m.handshakes.WithLabelValues(o)
	}
	for _, r := range linkEndReasons {
		m.linkEnds.WithLabelValues(r)
	}
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(r)
	}
	for _, o := range redeemOutcomes {
		m.redeems.WithLabelValues(o)
	}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	m.dropLinkMalformed = m.dropped.WithLabelValues("link_malformed")
	m.dropNoSession = m.dropped.WithLabelValues("no_session")
	m.dropUnknownSession = m.dropped.WithLabelValues("unknown_session")
	m.dropWrongInstance = m.dropped.WithLabelValues("wrong_instance")
	m.dropClientMalformed = m.dropped.WithLabelValues("client_malformed")
	m.dropOffline = m.dropped.WithLabelValues("instance_offline")
	m.dropTooLong = m.dropped.WithLabelValues("too_long")
	m.dropClientOverflow = m.dropped.WithLabelValues("client_overflow")
	m.slowClientQueue = m.slowClosed.WithLabelValues("client")
	m.slowClientInstance = m.slowClosed.WithLabelValues("instance")
	m.slowClientLink = m.slowClosed.WithLabelValues("link")
	if reg != nil {
		reg.MustRegister(m.links, m.attachments, m.toClient, m.toInstance, m.handshakes, m.linkEnds,
			m.refused, m.redeems, m.dropped, m.slowClosed)
	}
	return m
}

var handshakeOutcomes = []string{"welcome", "unknown_instance", "unsupported_version", "malformed", "timeout", "superseded", "store_unavailable", "draining"}

var linkEndReasons = []string{"eof", "replaced", "heartbeat_timeout", "line_too_long", "truncated", "revoked", "drain", "fenced", "overflow", "error"}

var refusalReasons = []string{"not_upgrade", "no_bearer", "bad_token", "wrong_account", "too_many_attachments", "draining", "store_error"}

var redeemOutcomes = []string{"paired", "malformed", "unknown", "used", "expired", "error"}
