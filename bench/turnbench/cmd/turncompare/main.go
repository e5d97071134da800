// Command turncompare runs the TURN comparison (package bench/turnbench)
// on its own and prints its Markdown report: edgerelay's TURN server
// beside coturn's turnserver, pinned to separate cores from the load
// generator (or, with -vs-nogro, beside itself with UDP_GRO off). coturn
// must be installed (.ci/install-coturn.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"edgerelay/bench/turnbench"
)

func main() {
	var o turnbench.Options
	payloads := flag.String("payloads", "120,1200", "comma-separated ChannelData payload sizes")
	flag.IntVar(&o.Rounds, "rounds", 7, "rounds per payload, the first a warm-up")
	flag.DurationVar(&o.Duration, "duration", 2*time.Second, "counted time per run")
	flag.IntVar(&o.Allocations, "allocations", 8, "concurrent allocations")
	flag.IntVar(&o.Window, "window", 0, "datagrams in flight per allocation (0: 16, or twice -gso)")
	flag.IntVar(&o.GSO, "gso", 0, "send each client's window as GSO runs of this many datagrams (UDP_SEGMENT), so that input arrives GRO-coalesced where the server enabled UDP_GRO; 0: one datagram per send")
	flag.BoolVar(&o.PeerGSO, "peer-gso", false, "with -gso, the echo peers send back in GSO runs of as many datagrams too, so that input arrives coalesced on both legs")
	transport := flag.String("transport", "udp", "the clients' leg to the server: udp, tcp or tls (turns:)")
	flag.IntVar(&o.ServerCPU, "server-cpu", 0, "core for the servers")
	flag.IntVar(&o.LoadCPU, "load-cpu", 1, "core for the load generator")
	flag.IntVar(&o.SocketBuffer, "socket-buffer", 0, "our server's socket buffer in bytes (0: its default)")
	flag.IntVar(&o.ProfileSeconds, "profile", 5, "seconds of CPU profile of our server (0: none)")
	flag.BoolVar(&o.BaselineNoGRO, "vs-nogro", false, "compare ours against ours with UDP_GRO off (turnserve -no-gro) instead of coturn; with -gso, what coalesced reads are worth")
	flag.StringVar(&o.BaselineTurnserve, "vs-turnserve", "", "compare ours against this other turnserve binary (say, a build from before a change) instead of coturn")
	flag.StringVar(&o.Turnserve, "turnserve", "", "our server's binary (bench/turnbench/cmd/turnserve); empty: built from this checkout")
	flag.Parse()
	for _, p := range strings.Split(*payloads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			fmt.Fprintln(os.Stderr, "turncompare: -payloads:", err)
			os.Exit(2)
		}
		o.Payloads = append(o.Payloads, n)
	}
	o.Transport = turnbench.Transport(*transport)
	o.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := turnbench.Compare(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "turncompare:", err)
		os.Exit(1)
	}
	fmt.Print(rep.Markdown())
}
