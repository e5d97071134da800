package cluster

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics adds the node's cluster health to reg (a cluster node
// registers once; a command-line client has no peers to report):
//
//   - edgerelay_cluster_nats_connected: 1 while the NATS connection is up;
//   - edgerelay_cluster_store_available: 1 while the shared store takes
//     writes (JetStream answers), 0 while writes answer 503;
//   - edgerelay_cluster_peers: the other nodes this node hears (beats
//     within the silence limit). A node found in er_nodes at start is
//     taken for running before its first beat (PeerAlive) but counted
//     only once heard: until then this node has no route to it, and could
//     judge it gone only when the start's grace ends;
//   - edgerelay_cluster_peers_gone_total: peers judged gone (silent,
//     restarted or left), each (node, incarnation) once;
//   - edgerelay_cluster_fenced_total: times this node fenced itself (the
//     others may have judged it gone: its live sockets were closed).
//
// The counters are fed by OnPeerGone and OnFenced callbacks registered
// here, after the series are.
func (c *Cluster) RegisterMetrics(reg prometheus.Registerer) error {
	bool01 := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	gone := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "edgerelay_cluster_peers_gone_total",
		Help: "Peer nodes judged gone (no beat for the silence limit, restarted, or left), each incarnation once.",
	})
	fenced := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "edgerelay_cluster_fenced_total",
		Help: "Times this node fenced itself because the other nodes may have judged it gone (its live sockets closed and reconnect).",
	})
	collectors := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgerelay_cluster_nats_connected",
			Help: "1 while this node's NATS connection is up, else 0.",
		}, func() float64 { return bool01(c.nc.IsConnected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgerelay_cluster_store_available",
			Help: "1 while the cluster's shared store (JetStream) takes writes, 0 while writes answer 503.",
		}, func() float64 { return bool01(c.Unavailable() == nil) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgerelay_cluster_peers",
			Help: "Other nodes this node hears (a beat within the silence limit); a node found in er_nodes at start counts once heard.",
		}, c.livePeers),
		gone, fenced,
	}
	for _, col := range collectors {
		if err := reg.Register(col); err != nil {
			return fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	c.OnPeerGone(func(string, string) { gone.Inc() })
	c.OnFenced(fenced.Inc)
	return nil
}

// livePeers is the number of other nodes heard from.
func (c *Cluster) livePeers() float64 {
	p := c.peers
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(len(p.seen) - len(p.seeded))
}
