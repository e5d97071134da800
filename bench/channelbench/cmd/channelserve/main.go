// Command channelserve runs one relay of the private channel benchmarks
// (bench/channelbench) in a process of its own, so that the comparisons
// can pin it to a core and read its CPU time, allocations and memory apart
// from the load generator's. See channelbench.ServeProcess for what it
// prints and answers; closing its standard input stops it.
//
//	channelserve -relay ours|baseline [-data DIR]
package main

import (
	"flag"
	"fmt"
	"os"

	"edgerelay/bench/channelbench"
)

func main() {
	relay := flag.String("relay", "ours", "the relay to serve: ours or baseline")
	data := flag.String("data", "", "our relay's store directory (a temporary one when empty)")
	flag.Parse()
	if err := channelbench.ServeProcess(*relay, *data, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "channelserve:", err)
		os.Exit(1)
	}
}
