package mailboxjs

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/storetest"
)

// TestMailboxContract runs the mailbox store contract over 3 nodes, one
// Mailboxes per node, each call of a case through the next node. Writers
// race across nodes, so the concurrent part runs too. The backend departs
// from the spec in three declared ways (each strict case fails with its
// flag off): heartbeats within TouchEvery are not persisted, the head's
// byte caps make a widely spread direction full early, and the envelope
// bucket is per direction.
func TestMailboxContract(t *testing.T) {
	_, mbs := startMailboxes(t, storetest.MailboxTestLimits())
	storetest.Mailbox(t, mbs, storetest.MailboxTestLimits(), storetest.MailboxOptions{
		Concurrent:                 true,
		CoalescedHeartbeats:        true,
		HeadCaps:                   true,
		PerDirectionEnvelopeBucket: true,
	})
}

// startMailboxes runs a 3-node cluster with a Mailboxes on each node.
func startMailboxes(t *testing.T, lim store.MailboxLimits) ([]*Mailboxes, []store.Mailboxes) {
	t.Helper()
	_, st := start(t)
	var out []*Mailboxes
	var ifs []store.Mailboxes
	for _, s := range st {
		m, err := NewMailboxes(clustertest.Context(t), s, lim, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		out = append(out, m)
		ifs = append(ifs, m)
	}
	return out, ifs
}
