package store

import (
	"os"
	"runtime"
	"strconv"
)

// MinProcs is the fewest Ps (GOMAXPROCS) a process that commits to the
// store should run with.
//
// A synced commit blocks its thread in fdatasync, and the thread keeps
// its P for the whole call. With a single P (Go's default on one core, or
// in a container limited to one CPU) nothing else runs meanwhile and no
// thread waits on the network: requests that arrive during a sync wait
// until the runtime's monitor takes the P back, up to milliseconds later,
// and miss the next group commit. Measured with the mailbox PUT benchmark
// on one pinned core, 64 concurrent writers: about 14,700 synced PUTs per
// second with one P, 29,200 with two, 30,100 with four; one writer and
// the read paths are unchanged within noise.
const MinProcs = 2

// EnsureProcs raises GOMAXPROCS to MinProcs when it is lower and the
// operator has not set it: a GOMAXPROCS environment variable that the
// runtime obeys (a positive number) is obeyed here too. It returns the
// setting in force and whether it raised it. It changes the process, so
// only a main function calls it.
func EnsureProcs() (procs int, raised bool) {
	procs = runtime.GOMAXPROCS(0)
	if procs >= MinProcs {
		return procs, false
	}
	if n, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err == nil && n > 0 {
		return procs, false
	}
	runtime.GOMAXPROCS(MinProcs)
	return MinProcs, true
}
