// Command watchmem is the server half of the watch-memory figure of `make
// bench`: it serves our mailbox handler or the net/http baseline on a
// loopback port, in a process of its own so that its resident memory is
// the server's alone, and reports that memory when asked on standard
// input. The benchmark (mailboxbench.CompareWatchMemory) starts it, opens
// thousands of watch sockets to it and reads the difference.
//
//	watchmem -impl ours|baseline [-max-life 10m]
//
// See mailboxbench.ServeWatchmem for the commands it answers. It exits
// when standard input ends, or after -max-life whatever happens.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"edgerelay/bench/mailboxbench"
)

func main() {
	impl := flag.String("impl", "ours", "which relay to serve: ours or baseline")
	maxLife := flag.Duration("max-life", 10*time.Minute, "exit after this long even if standard input stays open")
	flag.Parse()
	if err := mailboxbench.ServeWatchmem(*impl, os.Stdin, os.Stdout, *maxLife); err != nil {
		fmt.Fprintln(os.Stderr, "watchmem:", err)
		os.Exit(1)
	}
}
