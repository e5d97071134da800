package mailboxlocal_test

import (
	"testing"

	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
	"edgerelay/store/storetest"
)

// TestMailboxContract runs the mailbox store contract over the single
// node's backend, the same Store as every handle, with none of the
// cluster's departures declared: every strict case runs. Concurrent runs
// too: the Store serializes one mailbox's decisions itself (the handler
// does not).
func TestMailboxContract(t *testing.T) {
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	st, err := mailboxlocal.New(mailboxlocal.Config{Log: store.NewEnvelopeLog(db), Limits: storetest.MailboxTestLimits()})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Mailbox(t, []store.Mailboxes{st, st, st}, storetest.MailboxTestLimits(), storetest.MailboxOptions{Concurrent: true})
}
