// Command signalserve runs one relay of the signal benchmark
// (bench/signalbench) in a process of its own, so that the comparison can
// pin it to a core and read its CPU time and allocations apart from the
// load generator's. See signalbench.ServeProcess for what it prints and
// reads; closing its standard input stops it.
package main

import (
	"flag"
	"fmt"
	"os"

	"edgerelay/bench/signalbench"
)

func main() {
	relay := flag.String("relay", "ours", "the relay to serve: ours or baseline")
	data := flag.String("data", "", "our relay's store directory (a temporary one when empty)")
	flag.Parse()
	if err := signalbench.ServeProcess(*relay, *data, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
