package channelbench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	baseline "edgerelay/bench/baseline/channel"
	"edgerelay/bench/channelload"
	"edgerelay/bench/relayserve"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/channel"
	"edgerelay/store"
)

// relay is one relay under test, listening on loopback. Every load run
// claims a computer and so spends a claim key, which newKey mints the
// way an operator adds a computer to a running relay.
type relay struct {
	name   string
	origin string
	newKey func() (string, error)
	open   func() int // sockets held: control sockets and phone channels
	close  func() error
}

// hosts numbers the computers that keys are minted for: host names are
// unique per store.
var hosts atomic.Int64

func nextHost() string { return fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), hosts.Add(1)) }

// startOurs serves our relay the way the binary does (relayserve.Channel:
// fastpath/channel on fastpath/server, sockets detached, claims in
// Pebble); its keys are added through the operator's own key management.
// dataDir holds the Pebble store; when empty a temporary directory is
// made and removed again by close.
func startOurs(dataDir string) (*relay, error) {
	tmp := ""
	if dataDir == "" {
		d, err := os.MkdirTemp("", "channelbench-")
		if err != nil {
			return nil, fmt.Errorf("channelbench: %w", err)
		}
		tmp, dataDir = d, d
	}
	removeTmp := func() error {
		if tmp == "" {
			return nil
		}
		return os.RemoveAll(tmp)
	}
	db, err := store.Open(dataDir, nil)
	if err != nil {
		return nil, errors.Join(err, removeTmp())
	}
	claims := store.NewChannelClaims(db)
	// Pings are pushed beyond any run so they never interleave with the
	// load; the send-queue bound and frame limits stay at their defaults.
	h := channel.New(channel.Config{Claims: claims, PingInterval: time.Hour, DetachSockets: true})
	r, err := relayserve.Channel("", h)
	if err != nil {
		return nil, errors.Join(err, db.Close(), removeTmp())
	}
	return &relay{
		name:   "ours",
		origin: "http://" + r.Addr,
		newKey: func() (string, error) { return (channel.Keys{Claims: claims}).Add(nextHost()) },
		open:   h.Open,
		close:  func() error { return errors.Join(r.Close(), db.Close(), removeTmp()) },
	}, nil
}

// startBaseline serves the net/http + gorilla/websocket + encoding/json
// baseline; it keeps everything in memory.
func startBaseline() (*relay, error) {
	h := baseline.New(nil)
	// Hijacked WebSockets are not tracked by Shutdown; the load generator
	// has closed them all by the time Close runs.
	r, err := relayserve.Baseline("baseline", "", h, nil, nil)
	if err != nil {
		return nil, err
	}
	return &relay{
		name:   "baseline",
		origin: "http://" + r.Addr,
		newKey: func() (string, error) {
			key := channelload.NewToken()
			h.AddClaimKey(key, nextHost())
			return key, nil
		},
		open:  h.Open,
		close: r.Close,
	}, nil
}

func startRelay(name, dataDir string) (*relay, error) {
	switch name {
	case "ours":
		return startOurs(dataDir)
	case "baseline":
		return startBaseline()
	}
	return nil, fmt.Errorf("channelbench: unknown relay %q (want ours or baseline)", name)
}

// ServeProcess is the body of cmd/channelserve, one relay of the
// comparisons in a process of its own: it starts relay ("ours" or
// "baseline"; ours keeps its store in dataDir, a temporary directory when
// empty), then serves serverproc's commands ("ready <origin>", then gc,
// usage, mem, …; see serverproc.Serve) and two of its own until in ends:
//
//	key      "ok <claim key>": a fresh claim key for a new computer
//	count    "ok <n>": the sockets the relay holds
func ServeProcess(relayName, dataDir string, in io.Reader, out io.Writer) (err error) {
	if _, err := serverproc.RaiseFileLimit(); err != nil {
		return err
	}
	r, err := startRelay(relayName, dataDir)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	return serverproc.Serve(serverproc.ServeOptions{Ready: r.origin, Commands: serverproc.Commands{
		"key":   func(string) (string, error) { return r.newKey() },
		"count": func(string) (string, error) { return strconv.Itoa(r.open()), nil },
	}}, in, out)
}
