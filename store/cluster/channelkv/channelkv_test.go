package channelkv_test

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/cluster/channelkv"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/storetest"
)

// open returns one claim store per running node of nodes.
func open(t *testing.T, nodes *clustertest.Nodes) []*channelkv.Claims {
	t.Helper()
	var out []*channelkv.Claims
	for i := range nodes.Len() {
		if nodes.Node(i) == nil {
			continue
		}
		c, err := channelkv.New(clustertest.Context(t), nodes.Node(i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func asStores(cs []*channelkv.Claims) []store.ChannelClaimStore {
	out := make([]store.ChannelClaimStore, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

// TestChannelContract runs the claim store contract across 3 nodes, each
// call through the next node.
func TestChannelContract(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	storetest.Channel(t, asStores(open(t, nodes)))
}
