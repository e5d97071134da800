// Command turnserve runs edgerelay's TURN server alone, for the TURN
// benchmark (bench/turnbench): a process of its own can be pinned to a
// core with taskset, like coturn's turnserver beside it.
//
// It prints one line, "turnserve udp=ADDR debug=ADDR" (and tls=ADDR with
// -tls-listen), once it listens; TCP listens on the UDP address's port.
// The debug address serves /debug/pprof/ and /stats (JSON: the process's
// malloc count and GC cycles, and the packets the server relayed), so the
// benchmark can take allocations per relayed packet and a CPU profile from
// outside. SIGTERM or SIGINT drains and exits.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/turn"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "turnserve:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:0", "UDP and TCP listen address")
	secret := flag.String("secret", "", "TURN REST shared secret")
	realm := flag.String("realm", "edgerelay", "realm")
	allow := flag.String("allow-peers", "127.0.0.0/8", "comma-separated peer prefixes opened despite the default deny")
	debug := flag.String("debug", "127.0.0.1:0", "address for /stats and /debug/pprof/")
	maxAllocs := flag.Int("max-allocations", 0, "allocation cap (0: the package default)")
	socketBuffer := flag.Int("socket-buffer", 0, "receive and send buffer of the listener and each relay socket, bytes (0: turn.DefaultSocketBuffer)")
	tlsListen := flag.String("tls-listen", "", "turns: (TLS over TCP) listen address; empty: none")
	tlsCert := flag.String("tls-cert", "", "PEM certificate for -tls-listen")
	tlsKey := flag.String("tls-key", "", "PEM private key for -tls-listen")
	noGRO := flag.Bool("no-gro", false, "leave UDP_GRO off on the listener and the relay sockets (turn.Config.NoGRO), to measure what coalesced reads are worth")
	noHairpin := flag.Bool("no-hairpin", false, "send datagrams between two allocations of the server through the kernel (turn.Config.NoHairpin), to measure what handing them over in the process is worth")
	flag.Parse()

	var prefixes []netip.Prefix
	for _, s := range strings.Split(*allow, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("-allow-peers: %w", err)
		}
		prefixes = append(prefixes, p)
	}
	var tlsConfig *tls.Config
	if *tlsListen != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			return fmt.Errorf("-tls-cert, -tls-key: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	reg := prometheus.NewRegistry()
	srv, err := turn.Start(turn.Config{
		TLS:            tlsConfig,
		TLSListen:      *tlsListen,
		Listen:         *listen,
		Secret:         *secret,
		Realm:          *realm,
		AllowPeers:     prefixes,
		MaxAllocations: *maxAllocs,
		SocketBuffer:   *socketBuffer,
		NoGRO:          *noGRO,
		NoHairpin:      *noHairpin,
		MaxPerUser:     -1,
		MaxPerIP:       -1,
		Log:            slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Metrics:        reg,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *debug)
	if err != nil {
		return fmt.Errorf("debug listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st := Stats{Mallocs: ms.Mallocs, NumGC: ms.NumGC, Allocations: srv.Allocations()}
		st.RelayedPackets, st.RelayedBytes = relayed(reg)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()

	line := fmt.Sprintf("turnserve udp=%s debug=%s", srv.Addr(), ln.Addr())
	if tlsConfig != nil {
		line += fmt.Sprintf(" tls=%s", srv.TLSAddr())
	}
	fmt.Println(line)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(ctx)
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// Stats is the /stats answer.
type Stats struct {
	Mallocs        uint64 `json:"mallocs"`
	NumGC          uint32 `json:"num_gc"`
	Allocations    int    `json:"allocations"`
	RelayedPackets uint64 `json:"relayed_packets"`
	RelayedBytes   uint64 `json:"relayed_bytes"`
}

// relayed sums the relayed packet and byte counters over both directions.
func relayed(reg *prometheus.Registry) (packets, bytes uint64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		switch mf.GetName() {
		case "edgerelay_turn_relayed_packets_total":
			packets = uint64(sum)
		case "edgerelay_turn_relayed_bytes_total":
			bytes = uint64(sum)
		}
	}
	return packets, bytes
}
