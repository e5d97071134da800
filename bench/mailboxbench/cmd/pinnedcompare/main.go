// Command pinnedcompare runs the pinned mailbox comparison
// (mailboxbench.ComparePinned) on its own and prints its rows of the
// report's table, then the top of each CPU profile of our server when
// -profile-dir is given: HEAD and GET against the net/http baseline, and
// synced envelope PUTs against raw Pebble, each server a process of its
// own pinned to one core and the load generator (this process) to
// another. Run it from inside the module (it builds cmd/mailboxserve).
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

	"edgerelay/bench/mailboxbench"
)

func main() {
	var o mailboxbench.PinnedOptions
	writers := flag.String("writers", "1,64", "comma-separated PUT writer counts")
	flag.IntVar(&o.Rounds, "rounds", 6, "rounds per figure, the first a warm-up")
	flag.DurationVar(&o.RoundTime, "round", 2*time.Second, "time of one side's run in one round")
	flag.IntVar(&o.Conns, "conns", 8, "read connections, one request in flight each")
	flag.IntVar(&o.Pipeline, "pipeline", 16, "requests pipelined per connection in the pipelined read figures (1: leave them out)")
	flag.IntVar(&o.Mailboxes, "mailboxes", 64, "mailboxes the reads spread over")
	flag.IntVar(&o.Stored, "stored", 100, "envelopes stored per mailbox for the reads")
	flag.IntVar(&o.EnvelopeSize, "size", 1024, "envelope size in bytes")
	flag.IntVar(&o.ServerCPU, "server-cpu", 0, "core for the servers")
	flag.IntVar(&o.LoadCPU, "load-cpu", 1, "core for the load generator")
	flag.StringVar(&o.DataDir, "data-dir", "", "where the stores go (default: a temporary directory)")
	flag.StringVar(&o.ProfileDir, "profile-dir", "", "keep a CPU profile of each server per figure here (default: none)")
	flag.IntVar(&o.EnvelopeCache, "envelope-cache", 0, "our relay's envelope cache in bytes (0: the default, as serve runs; negative: none, every GET a first read)")
	flag.IntVar(&o.ServerGOMAXPROCS, "server-gomaxprocs", 0, "GOMAXPROCS of every server process (default: 2 for ours and the Pebble writers, as the relay runs; the runtime's, 1 on one pinned core, for net/http and the HEAD floor)")
	flag.Parse()
	for _, w := range strings.Split(*writers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil {
			fmt.Fprintln(os.Stderr, "pinnedcompare: -writers:", err)
			os.Exit(2)
		}
		o.Writers = append(o.Writers, n)
	}
	o.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := mailboxbench.ComparePinned(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pinnedcompare:", err)
		os.Exit(1)
	}
	fmt.Printf("%s; %s; pinned %v; took %v\n\n", rep.Machine, rep.Go, rep.Pinned, rep.Elapsed.Round(time.Second))
	fmt.Print("| figure | ours | baseline | ratio | goal |\n|---|---|---|---|---|\n")
	fmt.Print(rep.Markdown())
	for _, w := range rep.Warnings {
		fmt.Printf("\nWarning: %s\n", w)
	}
	for _, p := range rep.Profiles {
		fmt.Printf("\nCPU profile, %s (%s):\n\n```\n%s```\n", p.Figure, p.File, p.Top)
	}
}
