package mailboxbench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	baseline "edgerelay/bench/baseline/mailbox"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
)

// ServeWatchmem is the watch-memory server (cmd/watchmem): it serves our
// mailbox handler (impl "ours") or the baseline ("baseline") on a loopback
// port over a fresh store in a temporary directory, then serverproc's
// commands ("ready <addr>", then mem, heap-profile, …; see
// serverproc.Serve) and one of its own, "count": how many watch sockets
// the handler holds, cheaply, to wait for sockets to arrive.
//
// It stops when in ends or after maxLife, whichever comes first, so that
// a benchmark that dies cannot leave it behind. The relays use the real
// clock and the spec's ping (30 s) and silence (75 s) timers: sockets
// whose clients never answer a ping are closed after 75 s, which bounds
// how long a measurement may take.
func ServeWatchmem(impl string, in io.Reader, out io.Writer, maxLife time.Duration) (err error) {
	if _, err := serverproc.RaiseFileLimit(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "watchmem-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	db, err := store.Open(dir, nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	log := store.NewEnvelopeLog(db)

	var r *relay
	var open func() int
	switch impl {
	case "ours":
		var h *mailbox.Handler
		if r, h, err = startOurs(loopback, log, time.Now, 0); err == nil {
			open = h.Open
		}
	case "baseline":
		var h *baseline.Handler
		if r, h, err = startBaseline(loopback, log, time.Now); err == nil {
			open = h.Open
		}
	default:
		return fmt.Errorf("watchmem: impl %q: want ours or baseline", impl)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	return serverproc.Serve(serverproc.ServeOptions{Ready: r.addr, MaxLife: maxLife, Commands: serverproc.Commands{
		"count": func(string) (string, error) { return strconv.Itoa(open()), nil },
	}}, in, out)
}
