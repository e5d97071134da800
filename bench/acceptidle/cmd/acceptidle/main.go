// Command acceptidle measures the resident memory per idle accepted
// connection of a fasthttp server as the relay runs one (package
// bench/acceptidle): connections that send nothing, parked until their
// first byte and not, and plain HTTP keep-alive connections idle after
// one request. It starts itself as each server (-park on|off).
//
//	go run ./bench/acceptidle/cmd/acceptidle [-n 10000] [-rounds 1] [-aliases 16] [-kinds silent,keepalive]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"edgerelay/bench/acceptidle"
)

func main() {
	park := flag.String("park", "", "run as the server: on (park until the first byte) or off")
	n := flag.Int("n", 10_000, "connections each server holds")
	rounds := flag.Int("rounds", 1, "servers per kind and side, alternately parked and unparked")
	aliases := flag.Int("aliases", 16, "loopback source addresses (127.0.0.2 onwards)")
	kinds := flag.String("kinds", "silent,keepalive", "kinds of connection measured")
	reduce := flag.Bool("reduce-idle-memory", false, "the servers run with server.Service.ReduceIdleMemory (fasthttp's ReduceMemoryUsage)")
	flag.Parse()
	if *park != "" {
		if *park != "on" && *park != "off" {
			fmt.Fprintln(os.Stderr, "acceptidle: -park on or off")
			os.Exit(2)
		}
		if err := acceptidle.ServeProcess(*park == "on", *reduce, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "acceptidle:", err)
			os.Exit(1)
		}
		return
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "acceptidle:", err)
		os.Exit(1)
	}
	var ks []acceptidle.Kind
	for _, k := range strings.Split(*kinds, ",") {
		ks = append(ks, acceptidle.Kind(strings.TrimSpace(k)))
	}
	fmt.Printf("acceptidle: %s, %s/%s, %d cores, %d connections per server\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), *n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if _, err := acceptidle.Measure(ctx, acceptidle.Options{
		Argv: argv(self, *reduce), Sockets: *n, Rounds: *rounds, Aliases: *aliases, Kinds: ks, Progress: os.Stdout,
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// argv starts a server like this run's.
func argv(self string, reduce bool) []string {
	if reduce {
		return []string{self, "-reduce-idle-memory"}
	}
	return []string{self}
}
