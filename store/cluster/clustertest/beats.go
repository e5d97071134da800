package clustertest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// WaitBeat waits until nc carries a beat (store/cluster/peers.go,
// er.node.beat) whose "<node> <incarnation>" starts with prefix: from
// then on nc's server hears that node, and the nodes on it judge the node
// by its silence (a node never heard is alive for the start's grace).
func WaitBeat(t testing.TB, nc *nats.Conn, prefix string, within time.Duration) {
	t.Helper()
	heard := make(chan struct{}, 1)
	sub, err := nc.Subscribe("er.node.beat", func(m *nats.Msg) {
		if strings.HasPrefix(string(m.Data), prefix) {
			select {
			case heard <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatalf("clustertest: subscribe to the beats: %v", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	select {
	case <-heard:
	case <-time.After(within):
		t.Fatalf("clustertest: no beat of %q within %v", prefix, within)
	}
}
