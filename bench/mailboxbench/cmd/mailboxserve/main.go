// Command mailboxserve is the server half of the pinned mailbox
// comparison (mailboxbench.ComparePinned): one relay in a process of its
// own, which the benchmark runs pinned to one core (taskset -c 0) while
// its load generator runs on another, so that the server's CPU time,
// read from /proc, is the server's alone.
//
//	mailboxserve -relay ours|baseline|floor|floorput|pebble -dir DIR [-listen 127.0.0.1:0]
//	             [-mailboxes N -stored N -size BYTES] [-envelope-cache BYTES] [-cpuprofile FILE] [-max-life 30m]
//
// ours is fastpath/mailbox served by fastpath/server as the binary serves
// it; baseline is bench/baseline/mailbox on net/http; floor answers
// every request with canned bytes and floorput commits each request's
// body to raw Pebble first (the least any HTTP server can do per request
// and per synced write); pebble serves nothing and commits raw synced
// batches on command, the PUT ceiling.
// Both relays run on a clock that moves a second per reading, so the
// per-mailbox rate limits never refuse a benchmark. It writes "ready
// <addr>" once listening, then answers commands on standard input (see
// mailboxbench.ServePinned) and exits when that ends. With -cpuprofile, SIGUSR1
// starts a CPU profile and the next SIGUSR1 writes it (as does exit).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"edgerelay/bench/mailboxbench"
)

func main() {
	var c mailboxbench.ServeOptions
	flag.StringVar(&c.Relay, "relay", "ours", "what to serve: ours, baseline, floor, floorput or pebble")
	flag.StringVar(&c.Dir, "dir", "", "data directory (required; not shared with another process)")
	flag.StringVar(&c.Listen, "listen", "127.0.0.1:0", "listen address")
	flag.IntVar(&c.Mailboxes, "mailboxes", 0, "mailboxes to claim at start-up")
	flag.IntVar(&c.Stored, "stored", 0, "envelopes to store in each mailbox's p2c direction at start-up")
	flag.IntVar(&c.EnvelopeSize, "size", 1024, "envelope size in bytes (seeded and raw pebble writes)")
	flag.IntVar(&c.EnvelopeCache, "envelope-cache", 0, "ours: envelope cache bytes (0: the default; negative: none)")
	flag.StringVar(&c.CPUProfile, "cpuprofile", "", "CPU profile file, started and written by SIGUSR1 (and written at exit)")
	flag.DurationVar(&c.MaxLife, "max-life", 30*time.Minute, "exit after this long even if standard input stays open")
	flag.Parse()
	if err := mailboxbench.ServePinned(c, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
