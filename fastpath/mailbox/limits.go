package mailbox

import (
	"fmt"
	"time"

	"edgerelay/fastpath/bucket"
)

// limits are the per-mailbox token buckets of the spec kept by the node
// that serves the request (the envelope and push buckets are the store's,
// decided with the write).
type limits struct {
	fetches       *bucket.Set // fetches, HEADs, prunes, claims, erases: 240, 4/s
	connections   *bucket.Set // watch and signal sockets: 20, 1 per 5 s
	signalFrames  *bucket.Set // per side: 400, 50/s
	registrations *bucket.Set // push registrations: 10, 1/min
	ice           *bucket.Set // ICE credentials: 6, 1 per 30 s
}

func newLimits() (*limits, error) {
	mk := func(burst int, every time.Duration) (*bucket.Set, error) {
		s, err := bucket.NewSet(bucket.Config{Burst: burst, Interval: every})
		if err != nil {
			return nil, fmt.Errorf("mailbox: bucket %d per %v: %w", burst, every, err)
		}
		return s, nil
	}
	var l limits
	var err error
	for _, b := range []struct {
		dst   **bucket.Set
		burst int
		every time.Duration
	}{
		{&l.fetches, 240, time.Second / 4},
		{&l.connections, 20, 5 * time.Second},
		{&l.signalFrames, 400, time.Second / 50},
		{&l.registrations, 10, time.Minute},
		{&l.ice, 6, 30 * time.Second},
	} {
		if *b.dst, err = mk(b.burst, b.every); err != nil {
			return nil, err
		}
	}
	return &l, nil
}

func (l *limits) all() []*bucket.Set {
	return []*bucket.Set{l.fetches, l.connections, l.signalFrames, l.registrations, l.ice}
}

// sweep evicts idle full buckets so memory stays bounded under churn.
func (l *limits) sweep(now int64) {
	for _, s := range l.all() {
		s.Sweep(now)
	}
}

// dirKey is the bucket key of one direction (or signal side) of a mailbox.
func dirKey(mailboxKey uint64, dir byte) uint64 { return mailboxKey ^ uint64(dir)<<56 }
