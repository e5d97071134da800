package turn

import (
	"fmt"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus series. Labels are closed sets
// (reasons, quota names, directions): never a username, label or address,
// which would make the series unbounded and put identities in /metrics.
type metrics struct {
	allocations      prometheus.Gauge
	allocationsTotal prometheus.Counter
	authFailures     *prometheus.CounterVec
	quotaRefusals    *prometheus.CounterVec
	peerRefusals     prometheus.Counter
	streamRefusals   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, relays *relayTable, listener *net.UDPConn) (*metrics, error) {
	m := &metrics{
		allocations: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgerelay_turn_allocations", Help: "Current TURN allocations.",
		}),
		allocationsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_turn_allocations_total", Help: "TURN allocations made.",
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_turn_auth_failures_total", Help: "TURN requests refused with 401, by reason.",
		}, []string{"reason"}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgerelay_turn_quota_refusals_total", Help: "Allocations refused by quota (486) or for want of a relay port (508), by quota.",
		}, []string{"quota"}),
		peerRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_turn_peer_refusals_total", Help: "CreatePermission and ChannelBind requests refused with 403 for a denied peer address.",
		}),
		streamRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgerelay_turn_stream_refusals_total", Help: "TCP and TLS connections closed on accept for the connection caps.",
		}),
	}
	for _, r := range []string{authBadCredentials, authExpired, authMalformed, authWrongRealm} {
		m.authFailures.WithLabelValues(r)
	}
	for _, q := range []string{quotaTotal, quotaUser, quotaIP, quotaPorts} {
		m.quotaRefusals.WithLabelValues(q)
	}
	if reg == nil {
		return m, nil
	}
	// Relayed traffic is counted per allocation on the relay paths (no
	// shared cache line between the sockets' goroutines) and summed when
	// scraped.
	relayed := func(name, help, direction string, pick func(upP, upB, dnP, dnB uint64) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name, Help: help, ConstLabels: prometheus.Labels{"direction": direction},
		}, func() float64 { return float64(pick(relays.totals())) })
	}
	collectors := []prometheus.Collector{
		m.allocations, m.allocationsTotal, m.authFailures, m.quotaRefusals, m.peerRefusals, m.streamRefusals,
		relayed("edgerelay_turn_relayed_packets_total", "Datagrams relayed, by direction.", "to_peer",
			func(upP, _, _, _ uint64) uint64 { return upP }),
		relayed("edgerelay_turn_relayed_packets_total", "Datagrams relayed, by direction.", "to_client",
			func(_, _, dnP, _ uint64) uint64 { return dnP }),
		relayed("edgerelay_turn_relayed_bytes_total", "Payload bytes relayed, by direction.", "to_peer",
			func(_, upB, _, _ uint64) uint64 { return upB }),
		relayed("edgerelay_turn_relayed_bytes_total", "Payload bytes relayed, by direction.", "to_client",
			func(_, _, _, dnB uint64) uint64 { return dnB }),
	}
	if socketDropsCounted {
		// The kernel's own counters (SO_MEMINFO, the drops column of
		// /proc/net/udp), read when scraped: nothing on the relay paths.
		drops := func(socket string, count func() uint64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        "edgerelay_turn_socket_drops_total",
				Help:        "Datagrams the kernel dropped on the TURN server's UDP sockets (a full receive buffer: see RELAY_TURN_SOCKET_BUFFER), by socket: the listener, or the relay sockets of every allocation (closed ones included).",
				ConstLabels: prometheus.Labels{"socket": socket},
			}, func() float64 { return float64(count()) })
		}
		collectors = append(collectors,
			drops("listener", lastDrops(listener)),
			drops("relay", relays.drops))
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("turn: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) authFailed(reason string) { m.authFailures.WithLabelValues(reason).Inc() }
func (m *metrics) refused(quota string)     { m.quotaRefusals.WithLabelValues(quota).Inc() }
func (m *metrics) peerRefused()             { m.peerRefusals.Inc() }
func (m *metrics) streamRefused()           { m.streamRefusals.Inc() }

// lastDrops reads c's drop count, keeping the last one read once c is
// closed (at shutdown), so the counter never goes back to 0.
func lastDrops(c *net.UDPConn) func() uint64 {
	var last atomic.Uint64
	return func() uint64 {
		if n, ok := socketDrops(c); ok {
			last.Store(n)
		}
		return last.Load()
	}
}
