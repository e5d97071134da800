package agentkv_test

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/cluster/agentkv"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/storetest"
)

// open returns one agent store per running node of nodes.
func open(t *testing.T, nodes *clustertest.Nodes) []*agentkv.Store {
	t.Helper()
	var out []*agentkv.Store
	for i := range nodes.Len() {
		if nodes.Node(i) == nil {
			continue
		}
		s, err := agentkv.New(clustertest.Context(t), nodes.Node(i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func asRecords(ss []*agentkv.Store) []store.AgentRecords {
	out := make([]store.AgentRecords, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestAgentContract runs the agent records' contract across 3 nodes, each
// call through the next node.
func TestAgentContract(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	storetest.Agent(t, asRecords(open(t, nodes)))
}
