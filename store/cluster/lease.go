package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Leases make one socket in the whole cluster the holder of a name: a
// computer's control socket, an agent instance's link, a signal side. A
// lease is a KV record "<node> <incarnation> <generation>" changed by
// compare-and-set; whether its holder still runs is the peers' beats
// (PeerAlive), so a lease needs no refresh and a node that dies frees its
// leases within peerSilence, for whoever asks next.
type Leases struct {
	c  *Cluster
	kv jetstream.KeyValue
}

// Holder is who holds a lease; Gen grows with every hold of the key, so
// of two holders the newer is the one with the higher Gen.
type Holder struct {
	Node, Incarnation string
	Gen               uint64
}

// ErrHeld: an exclusive hold found a live holder.
var ErrHeld = errors.New("cluster: held by another socket")

// Leases opens (creating it if needed) the lease bucket named bucket.
func (c *Cluster) Leases(ctx context.Context, bucket string) (*Leases, error) {
	kv, err := c.Bucket(ctx, BucketConfig{Name: bucket})
	if err != nil {
		return nil, err
	}
	return &Leases{c: c, kv: kv}, nil
}

// value is the record of h; a released lease ("-" for node and
// incarnation) keeps its generation, so the next hold is newer than every
// earlier one.
func (h Holder) value() []byte {
	node, inc := h.Node, h.Incarnation
	if node == "" {
		node, inc = "-", "-"
	}
	return []byte(node + " " + inc + " " + strconv.FormatUint(h.Gen, 10))
}

func parseHolder(b []byte) (Holder, bool) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return Holder{}, false
	}
	gen, err := strconv.ParseUint(f[2], 10, 64)
	if f[0] == "-" {
		return Holder{Gen: gen}, err == nil // released
	}
	return Holder{Node: f[0], Incarnation: f[1], Gen: gen}, err == nil
}

// live reports whether h's node still runs h's incarnation.
func (l *Leases) live(h Holder) bool { return l.c.PeerAlive(h.Node, h.Incarnation) }

// Hold takes key for this node. Exclusive, it is refused with ErrHeld
// while a live holder has it; otherwise the newer hold wins. prev is the
// live holder this hold replaced (zero when there was none), for the
// caller to tell its node; me is this hold, whose Gen names it.
func (l *Leases) Hold(ctx context.Context, key string, exclusive bool) (me, prev Holder, err error) {
	for round := range holdRounds {
		// A conflict may be another write still in its Raft round (it
		// answers at once): contenders spread out instead of spending
		// every round in the same moment.
		if round > 0 && !Backoff(ctx, round-1, holdPause) {
			return Holder{}, Holder{}, Fail("lease "+key, ctx.Err())
		}
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		e, gerr := l.kv.Get(ctx, key)
		switch {
		case Absent(gerr):
			me = Holder{Node: l.c.node, Incarnation: l.c.incarnation, Gen: 1}
			_, err = l.kv.Create(ctx, key, me.value())
		case gerr != nil:
			cancel()
			return Holder{}, Holder{}, Fail("lease "+key, gerr)
		default:
			cur, _ := parseHolder(e.Value())
			alive := cur.Node != "" && l.live(cur)
			if exclusive && alive {
				cancel()
				return Holder{}, cur, ErrHeld
			}
			me = Holder{Node: l.c.node, Incarnation: l.c.incarnation, Gen: cur.Gen + 1}
			if alive {
				prev = cur
			}
			_, err = l.kv.Update(ctx, key, me.value(), e.Revision())
		}
		cancel()
		if err == nil {
			return me, prev, nil
		}
		if !Conflict(err) {
			return Holder{}, Holder{}, Fail("lease "+key, err)
		}
		prev = Holder{}
	}
	return Holder{}, Holder{}, Fail("lease "+key, fmt.Errorf("no hold after %d contended rounds", holdRounds))
}

// Hold's compare-and-set rounds and the longest pause between two: about
// 2 s of contention in all.
const (
	holdRounds = 64
	holdPause  = 64 * time.Millisecond
)

// Backoff waits before a retry of a write that collided, try the number
// of tries so far: a random wait (writers that collided would collide
// again at once), longer with each try up to max; false if ctx ends
// first.
func Backoff(ctx context.Context, try int, max time.Duration) bool {
	d := time.Duration(rand.Int64N(int64(min(try+1, 16)) * int64(max/16)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Release gives key back if me still holds it (a newer hold stays),
// keeping its generation in the record.
func (l *Leases) Release(ctx context.Context, key string, me Holder) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := l.kv.Get(ctx, key)
	switch {
	case Absent(err):
		return nil
	case err != nil:
		return Fail("release lease "+key, err)
	}
	if cur, _ := parseHolder(e.Value()); cur != me {
		return nil
	}
	if _, err := l.kv.Update(ctx, key, Holder{Gen: me.Gen}.value(), e.Revision()); err != nil && !Conflict(err) {
		return Fail("release lease "+key, err)
	}
	return nil
}

// Holder returns key's live holder, read through the stream's leader;
// ok is false when nobody holds it or its holder's node is gone.
func (l *Leases) Holder(ctx context.Context, key string) (h Holder, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := l.kv.Get(ctx, key)
	switch {
	case Absent(err):
		return Holder{}, false, nil
	case err != nil:
		return Holder{}, false, Fail("lease "+key, err)
	}
	h, parsed := parseHolder(e.Value())
	return h, parsed && h.Node != "" && l.live(h), nil
}
