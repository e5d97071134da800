package e2e

import "testing"

// TestRelayStarts: the harness finds every listener the tests reach.
func TestRelayStarts(t *testing.T) {
	r := startRelay(t)
	for _, s := range []string{"mailbox", "agent", "admin", "turn", "channel"} {
		if r.addrs[s] == "" {
			t.Errorf("no address for %s: %v", s, r.addrs)
		}
	}
}
