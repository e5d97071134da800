// Command webrtccompare runs the real-traffic TURN comparison (package
// bench/turnbench, CompareWebRTC) on its own and prints its Markdown
// report: two headless Chromium pages move bytes over a relay-only data
// channel through edgerelay's TURN server and through coturn's, ABBA.
// Needs /usr/bin/chromium, node, sdk/js's node_modules and turnserver.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"edgerelay/bench/turnbench"
)

func main() {
	var o turnbench.WebRTCOptions
	flag.IntVar(&o.Rounds, "rounds", 5, "rounds, the first a warm-up")
	mb := flag.Int("mb", 100, "MB (10^6 bytes) moved per run")
	flag.IntVar(&o.Message, "message", 16384, "data channel message size")
	flag.IntVar(&o.ServerCPU, "server-cpu", 0, "core for the servers")
	flag.IntVar(&o.LoadCPU, "load-cpu", 1, "core for the browser (-1: not pinned)")
	flag.IntVar(&o.SocketBuffer, "socket-buffer", 0, "our server's socket buffer in bytes (0: its default)")
	flag.StringVar(&o.Turnserve, "turnserve", "", "our server's binary (bench/turnbench/cmd/turnserve; built when empty)")
	flag.StringVar(&o.Chromium, "chromium", "/usr/bin/chromium", "the browser")
	flag.Parse()
	o.Bytes = *mb * 1_000_000
	o.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := turnbench.CompareWebRTC(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webrtccompare:", err)
		os.Exit(1)
	}
	fmt.Print(rep.Markdown())
}
