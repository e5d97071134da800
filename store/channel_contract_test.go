package store_test

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/storetest"
)

// TestChannelContract runs the claim store contract against Pebble: one
// store stands for every node.
func TestChannelContract(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	c := store.NewChannelClaims(db)
	storetest.Channel(t, []store.ChannelClaimStore{c, c, c})
}
