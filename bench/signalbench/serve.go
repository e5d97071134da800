package signalbench

import (
	"errors"
	"fmt"
	"io"

	"edgerelay/bench/serverproc"
)

// ServeProcess is the body of cmd/signalserve, the relay's process in the
// comparison: it starts relay ("ours" or "baseline"; ours keeps its store
// in dataDir, a temporary directory when empty), then serves serverproc's
// commands ("ready <addr>", then gc, usage, …; see serverproc.Serve)
// until in ends, and stops the relay.
//
// A process of its own is what makes the figures the relay's alone: its
// CPU time and allocations leave out the load generator's, and it can be
// pinned to a core of its own.
func ServeProcess(relay, dataDir string, in io.Reader, out io.Writer) (err error) {
	var r *Relay
	switch relay {
	case "ours":
		r, err = StartOurs(dataDir)
	case "baseline":
		r, err = StartBaseline()
	default:
		return fmt.Errorf("signalserve: unknown relay %q (want ours or baseline)", relay)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	return serverproc.Serve(serverproc.ServeOptions{Ready: r.Addr}, in, out)
}
