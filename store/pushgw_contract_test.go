package store_test

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/storetest"
)

// TestPushGatewayContract runs the push gateway's contract against Pebble:
// one store per scope stands for every node.
func TestPushGatewayContract(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	scopes := map[store.PushScope]*store.PushGateway{}
	storetest.PushGateway(t, func(t *testing.T, scope store.PushScope) []store.PushGatewayStore {
		g := scopes[scope]
		if g == nil {
			var err error
			if g, err = store.NewPushGateway(db, scope); err != nil {
				t.Fatal(err)
			}
			scopes[scope] = g
		}
		return []store.PushGatewayStore{g, g, g}
	})
}
