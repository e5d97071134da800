package channel_test

import (
	"testing"
)

// Forget, called for a release or revocation made through another node,
// closes that computer's control socket with 1000 and its phones with
// 1001 as a local one does, and is a no-op for a computer this node does not hold.
func TestForgetClosesTheComputersSockets(t *testing.T) {
	r := startRelay(t, relayOpts{})
	key := r.addKey("box")
	c := r.claim(key)
	ctl := r.dialHost(c.owner)
	phone, _ := r.dialPhone(c.phone, ctl)
	r.h.Forget(hashOf("no such key"))
	r.h.Forget(hashOf(key))
	if code := closeCode(t, ctl); code != 1000 {
		t.Fatalf("control socket: close %d", code)
	}
	if code := closeCode(t, phone); code != 1001 {
		t.Fatalf("phone: close %d", code)
	}
}
