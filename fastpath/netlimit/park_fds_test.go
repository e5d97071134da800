//go:build linux

package netlimit

import (
	"testing"
	"time"
)

// With connections parked until their first byte, running out of
// descriptors is ridden out as without: connections are shed at once and
// counted, and once descriptors are free the next one parks and is
// served after its first byte.
func TestParkedOutOfFDsShedsAndRecovers(t *testing.T) {
	if inOwnProcess(t) {
		return
	}
	set := newSet(t)
	h := listen(t, Limits{}, func(l *Listener) { l.SetParker(set, time.Minute) })
	const attempts = 5
	clients := newRawClients(t, attempts+1)
	fill := exhaustFDs(t)
	h.serve()
	for _, c := range clients[:attempts] {
		c.connect(h.l.Addr())
		c.expectRefused(h)
	}
	if got := h.counts.snapshot()[ReasonFDs]; got != attempts {
		t.Fatalf("refusals counted as %q: %d, want %d", ReasonFDs, got, attempts)
	}
	fill.free(len(fill.fds))
	final := clients[attempts]
	final.connect(h.l.Addr())
	c := final.conn()
	waitFor(t, "the connection parked", func() bool { return h.l.Waiting() == 1 })
	h.expectNoneAccepted()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	h.expectAccepted(c)
}
