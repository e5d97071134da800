package signalbench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"runtime"
	"syscall"
	"time"
)

// ServeProcess is the body of cmd/signalserve, the relay's process in the
// comparison: it starts relay ("ours" or "baseline"; ours keeps its store
// in dataDir, a temporary directory when empty), writes
// "signalserve addr=HOST:PORT" to out, then answers each "stats" line on
// in with "stats mallocs=N cpu_ns=N": the process's heap allocations and
// its user plus system CPU time so far. At the end of in it stops the
// relay and returns.
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
	if _, err := fmt.Fprintf(out, "signalserve addr=%s\n", r.Addr); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "stats":
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if _, err := fmt.Fprintf(out, "stats mallocs=%d cpu_ns=%d\n", ms.Mallocs, processCPU()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("signalserve: unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// processCPU is this process's user plus system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
