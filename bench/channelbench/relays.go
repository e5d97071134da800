package channelbench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	baseline "edgerelay/bench/baseline/channel"
	"edgerelay/bench/relayserve"
	"edgerelay/fastpath/channel"
	"edgerelay/store"
)

// relay is one relay under test, listening on loopback, with claim keys
// made in advance: every load run claims a computer and so spends a key.
type relay struct {
	name   string
	origin string
	keys   []string
	close  func() error
}

// nextKey hands out the next unused claim key.
func (r *relay) nextKey() (string, error) {
	if len(r.keys) == 0 {
		return "", fmt.Errorf("channelbench: %s relay has no claim keys left", r.name)
	}
	k := r.keys[0]
	r.keys = r.keys[1:]
	return k, nil
}

// startOurs serves our relay the way the binary does (relayserve.Channel:
// fastpath/channel on fastpath/server, sockets detached, claims in Pebble), with n claim keys added through the
// operator's own key management. dataDir holds the Pebble store; when empty
// a temporary directory is made and removed again by close.
func startOurs(dataDir string, n int) (*relay, error) {
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
	keys := make([]string, n)
	for i := range keys {
		// Host names are unique per store; the time keeps them unique
		// when the caller reuses a data dir.
		host := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)
		if keys[i], err = (channel.Keys{Claims: claims}).Add(host); err != nil {
			return nil, errors.Join(err, db.Close(), removeTmp())
		}
	}
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
		keys:   keys,
		close:  func() error { return errors.Join(r.Close(), db.Close(), removeTmp()) },
	}, nil
}

// startBaseline serves the net/http + gorilla/websocket + encoding/json
// baseline with n claim keys; it keeps everything in memory.
func startBaseline(n int) (*relay, error) {
	keys := make([]string, n)
	byKey := make(map[string]string, n)
	for i := range keys {
		keys[i] = randomHex()
		byKey[keys[i]] = fmt.Sprintf("bench-%d", i)
	}
	// Hijacked WebSockets are not tracked by Shutdown; the load generator
	// has closed them all by the time Close runs.
	r, err := relayserve.Baseline("baseline", "", baseline.New(byKey), nil, nil)
	if err != nil {
		return nil, err
	}
	return &relay{name: "baseline", origin: "http://" + r.Addr, keys: keys, close: r.Close}, nil
}

func randomHex() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails since Go 1.24
	return hex.EncodeToString(b[:])
}
