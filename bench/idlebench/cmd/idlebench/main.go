// Command idlebench runs the idle-socket benchmarks of issue 18 (package
// bench/idlebench) and prints their figures: the resident memory of an
// idle socket of each kind (mailbox watch, signal, phone channel, control
// socket), plain and TLS, parked beside unparked; the cost of waking a
// parked watch socket with a delivery; and a reconnect storm against the
// accept path.
//
//	go run ./bench/idlebench/cmd/idlebench [-sockets 10000] [-only memory,wake,storm]
//
// More sockets than the open-file limit allows are capped, and the output
// says so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"edgerelay/bench/idlebench"
)

func main() {
	sockets := flag.Int("sockets", 10_000, "idle sockets of each kind per server (capped to the open-file limit)")
	kinds := flag.String("kinds", "watch,signal,phone,control,silent,keepalive", "socket kinds in the memory figures (silent and keepalive: the accept path's connections that never upgrade)")
	plainOnly := flag.Bool("plain-only", false, "leave out the TLS memory figures")
	rounds := flag.Int("rounds", 2, "servers per side and figure (alternated, fresh processes)")
	wakeSockets := flag.Int("wake-sockets", 1_000, "watch sockets in the wake figure")
	deliveries := flag.Int("deliveries", 3_000, "deliveries per server in the wake figure")
	stormSockets := flag.Int("storm-sockets", 10_000, "watch sockets in the reconnect storm")
	stormRounds := flag.Int("storm-rounds", 1, "servers per side in the reconnect storm")
	only := flag.String("only", "memory,wake,storm", "which figures to run")
	profiles := flag.String("profiles", "", "a directory for a heap profile of each memory figure's server, its sockets open")
	timeout := flag.Duration("timeout", 30*time.Minute, "bound on the whole run")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, *sockets, *kinds, *plainOnly, *rounds, *wakeSockets, *deliveries, *stormSockets, *stormRounds, *only, *profiles); err != nil {
		fmt.Fprintln(os.Stderr, "idlebench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, sockets int, kindList string, plainOnly bool, rounds, wakeSockets, deliveries, stormSockets, stormRounds int, only, profiles string) error {
	dir, err := os.MkdirTemp("", "idlebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := idlebench.Build(ctx, "", dir)
	if err != nil {
		return err
	}
	var ks []idlebench.Kind
	for _, s := range strings.Split(kindList, ",") {
		k, err := idlebench.ParseKind(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		ks = append(ks, k)
	}
	want := map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		want[strings.TrimSpace(s)] = true
	}
	var errs []error
	if want["memory"] {
		rep, err := idlebench.MeasureMemory(ctx, idlebench.MemoryOptions{Binary: bin, Sockets: sockets, Kinds: ks,
			PlainOnly: plainOnly, Rounds: rounds, ProfileDir: profiles, Progress: os.Stderr})
		rep.WriteText(os.Stdout)
		errs = append(errs, err)
	}
	if want["wake"] {
		rep, err := idlebench.MeasureWake(ctx, idlebench.WakeOptions{Binary: bin, Sockets: wakeSockets, Deliveries: deliveries,
			Rounds: rounds, Progress: os.Stderr})
		if err == nil {
			rep.WriteText(os.Stdout)
		}
		errs = append(errs, err)
	}
	if want["storm"] {
		rep, err := idlebench.MeasureStorm(ctx, idlebench.StormOptions{Binary: bin, Sockets: stormSockets, Rounds: stormRounds, Progress: os.Stderr})
		if err == nil {
			rep.WriteText(os.Stdout)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
