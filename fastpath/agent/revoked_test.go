package agent_test

import (
	"testing"
	"time"
)

// Revoked, called for a revocation made through another node (the store
// already says revoked), closes the instance's link and its clients with
// 1008 as a local revocation does, and is a no-op for an id this node does
// not hold.
func TestRevokedClosesLinkAndClients(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, _ := r.attachedSession(p, ctok, c)
	if _, err := r.st.RevokeInstance(p.id); err != nil { // as another node does
		t.Fatal(err)
	}
	r.h.Revoked("inst-nope")
	r.h.Revoked(p.id)
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("revoked link still open")
	}
	if code := cl.closeCode(); code != 1008 {
		t.Fatalf("client of a revoked instance: close %d", code)
	}
}
