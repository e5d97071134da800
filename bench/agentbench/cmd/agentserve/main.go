// Command agentserve runs one relay of the agent routing benchmark
// (bench/agentbench) in a process of its own, so that the comparison can
// pin it to a core and read its CPU time and allocations apart from the
// load generator's. See agentbench.ServeProcess for what it prints and
// answers; closing its standard input stops it.
//
//	agentserve -relay ours|baseline -dir DIR
package main

import (
	"flag"
	"fmt"
	"os"

	"edgerelay/bench/agentbench"
)

func main() {
	relay := flag.String("relay", "ours", "the relay to serve: ours or baseline")
	dir := flag.String("dir", "", "directory of the TLS certificate (<dir>/tls) and our relay's store (required)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "agentserve: -dir is required")
		os.Exit(2)
	}
	if err := agentbench.ServeProcess(*relay, *dir, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agentserve:", err)
		os.Exit(1)
	}
}
