package store_test

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/storetest"
)

// TestAgentContract runs the agent records' contract against Pebble: one
// store stands for every node.
func TestAgentContract(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s := store.NewAgentStore(db)
	storetest.Agent(t, []store.AgentRecords{s, s, s})
}
