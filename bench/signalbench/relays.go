package signalbench

import (
	"errors"
	"os"
	"time"

	baseline "edgerelay/bench/baseline/signal"
	"edgerelay/bench/relayserve"
	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

// The benchmark's app, bearer and mailboxes are relayserve's, shared with
// the mailbox benchmarks.
const (
	app   = relayserve.App
	token = relayserve.Token
)

func mailboxPath(i int) string { return relayserve.MailboxPath(i) }

// Both relays' clock here is a step clock (relayserve.StepClock) moving a
// second per reading. A signal socket reads the clock once per frame to
// take from its side's bucket (400 frames, 50 per second), so every frame
// finds the bucket refilled and the limit never refuses a benchmark at any
// speed, while the bucket is still consulted on every frame as in
// production.
func newClock() func() time.Time { return relayserve.NewStepClock(time.Second).Now }

// Pings and the silence rule are pushed beyond any run, so that no ping
// frame interleaves with the load and a socket idle while the other relay
// is measured is not closed. Ours still sets a read deadline per frame
// (SilenceTimeout is set, as in the binary), the baseline per message.
const (
	pingInterval   = time.Hour
	silenceTimeout = 2 * time.Hour
)

// Relay is one relay under test, listening on loopback.
type Relay = relayserve.Relay

// StartOurs serves the real mailbox handler (fastpath/mailbox, the app
// with the signal option) as the binary does (relayserve.Mailbox). The
// store lives in dir (a temporary directory, removed by Close, when
// empty); the clock is the step clock.
func StartOurs(dir string) (*Relay, error) {
	tmp := ""
	if dir == "" {
		d, err := os.MkdirTemp("", "signalbench-")
		if err != nil {
			return nil, err
		}
		tmp, dir = d, d
	}
	removeTmp := func() error {
		if tmp == "" {
			return nil
		}
		return os.RemoveAll(tmp)
	}
	db, err := store.Open(dir, nil)
	if err != nil {
		return nil, errors.Join(err, removeTmp())
	}
	st, err := mailboxlocal.New(mailboxlocal.Config{Log: store.NewEnvelopeLog(db), Limits: store.MailboxLimits{Idle: relayserve.IdleForever}})
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeTmp())
	}
	h, err := mailbox.New(mailbox.Config{
		Store:          st,
		Apps:           map[string]mailbox.App{app: {Name: app, Signal: true}},
		PingInterval:   pingInterval,
		SilenceTimeout: silenceTimeout,
		DetachSockets:  true,
		Now:            newClock(),
	})
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeTmp())
	}
	r, err := relayserve.Mailbox("", h)
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeTmp())
	}
	stop := r.Close
	r.Close = func() error { return errors.Join(stop(), db.Close(), removeTmp()) }
	return r, nil
}

// StartBaseline serves the net/http + gorilla/websocket baseline with the
// same timeouts, header limit and clock.
func StartBaseline() (*Relay, error) {
	h := baseline.New(baseline.Config{Apps: []string{app}, Now: newClock(), PingInterval: pingInterval})
	return relayserve.Baseline("baseline", "", h, nil, h.CloseSockets)
}
