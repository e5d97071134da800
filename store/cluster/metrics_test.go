package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/fastpath/promtest"
	"edgerelay/store/cluster/clustertest"
)

// The cluster health series move: the peer is counted while it beats,
// a fence is counted, and a peer that stops is counted gone and no more
// among the live ones; the node's own NATS connection stays up.
func TestClusterMetricsMove(t *testing.T) {
	nodes := clustertest.Start(t, 2)
	a, b := nodes.Node(0), nodes.Node(1)
	reg := prometheus.NewRegistry()
	if err := a.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := a.RegisterMetrics(reg); err == nil {
		t.Fatal("a second registration on one registry was accepted")
	}
	value := func(name string) float64 { return promtest.Must(t, reg, name, nil) }
	want := func(name string, v float64, within time.Duration) {
		t.Helper()
		waitFor(t, within, name, func() error {
			if got := value(name); got != v {
				return fmt.Errorf("%s = %v, want %v", name, got, v)
			}
			return nil
		})
	}
	if g, f := value("edgerelay_cluster_peers_gone_total"), value("edgerelay_cluster_fenced_total"); g != 0 || f != 0 {
		t.Fatalf("at start: peers gone %v, fenced %v", g, f)
	}
	want("edgerelay_cluster_nats_connected", 1, time.Second)
	want("edgerelay_cluster_store_available", 1, time.Second)
	clustertest.WaitBeat(t, a.Conn(), b.Node()+" "+b.Incarnation(), 10*time.Second)
	want("edgerelay_cluster_peers", 1, 5*time.Second)

	nodes.Fence(0, 1)
	want("edgerelay_cluster_fenced_total", 1, 5*time.Second)

	nodes.Stop(1)
	want("edgerelay_cluster_peers_gone_total", 1, 5*time.Second)
	want("edgerelay_cluster_peers", 0, time.Second)
	want("edgerelay_cluster_nats_connected", 1, time.Second)
}
