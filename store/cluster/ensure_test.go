package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store/cluster/clustertest"
)

// TestEnsureStreamFromEveryNodeAtOnce: every node of a fresh cluster
// making the same streams at once (as every node does at start) is
// answered at once. nats.go's CreateOrUpdateStream, which updates first,
// went unanswered until its request timed out (5 s) for every stream on
// every node when three raced: with it each node here misses the 3 s
// deadline on its first stream. A stream that exists with another config
// is brought to the new one.
func TestEnsureStreamFromEveryNodeAtOnce(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	config := func(k int) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: fmt.Sprintf("RACE_%d", k), Subjects: []string{fmt.Sprintf("race.%d.>", k)},
			Storage: jetstream.FileStorage, Replicas: 3, AllowDirect: true,
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range nodes.Len() {
		wg.Go(func() {
			for k := range 4 {
				if _, err := nodes.Node(i).EnsureStream(ctx, config(k)); err != nil {
					t.Errorf("node %d, stream %d: %v", i, k, err)
					return
				}
			}
		})
	}
	wg.Wait()

	changed := config(0)
	changed.MaxMsgs = 1000
	st, err := nodes.Node(1).EnsureStream(clustertest.Context(t), changed)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxMsgs; got != 1000 {
		t.Fatalf("an existing stream ensured with another config keeps max_msgs %d, want 1000", got)
	}
}
