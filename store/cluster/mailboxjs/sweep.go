package mailboxjs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// LeaseBucket holds the singleton leases (CLUSTER.md §3: er_leases).
const LeaseBucket = "er_leases"

const sweeperKey = "sweeper"

// Sweeper erases idle mailboxes, one node at a time: a sweep runs only on
// the node that holds the er_leases/sweeper lease, taken by
// create-if-absent with a per-key TTL so that a node that dies while
// holding it frees it by itself.
type Sweeper struct {
	s     *Store
	kv    jetstream.KeyValue
	owner string
	ttl   time.Duration
}

// NewSweeper binds the lease bucket. ttl must exceed one sweep's run (a
// sweep is bounded by its context).
func (s *Store) NewSweeper(ctx context.Context, ttl time.Duration) (*Sweeper, error) {
	kv, err := s.c.Bucket(ctx, cluster.BucketConfig{Name: LeaseBucket, KeyTTL: true})
	if err != nil {
		return nil, err
	}
	return &Sweeper{s: s, kv: kv, owner: s.c.Node() + "." + s.c.Incarnation(), ttl: ttl}, nil
}

// Sweep erases every mailbox whose claim and writes are all older than
// cutoff (unix ns), if this node wins the lease; ran reports whether it
// did. The lease is given back at the end, so the next round may run on
// any node.
func (sw *Sweeper) Sweep(ctx context.Context, cutoff int64) (erased []string, ran bool, err error) {
	rev, err := sw.kv.Create(ctx, sweeperKey, []byte(sw.owner), jetstream.KeyTTL(sw.ttl))
	if cluster.Conflict(err) {
		return nil, false, nil // another node sweeps
	}
	if err != nil {
		return nil, false, cluster.Fail("sweeper lease", err)
	}
	defer func() {
		dctx, cancel := cluster.Context()
		defer cancel()
		_ = cluster.Delete(dctx, sw.kv, sweeperKey, rev)
	}()
	for k := range sw.s.shards {
		var idle []string
		// Claims keep one message each (rollup), so reading the claim
		// subjects of a shard in stream order reads each claim once.
		from := uint64(1)
		for {
			got := 0
			last, err := sw.s.directBatch(ctx, streamName(k), fmt.Sprintf("mbx.%d.*.*.c", k), from, 0, 1024, 1<<20, func(m *msg) bool {
				got++
				if len(m.data) == store.HashLen+8 && int64(binary.BigEndian.Uint64(m.data[store.HashLen:])) < cutoff {
					parts := strings.Split(m.subject, ".") // mbx.k.app.id.c
					if len(parts) == 5 {
						idle = append(idle, parts[2]+"/"+parts[3])
					}
				}
				return true
			})
			if err != nil {
				return erased, true, err
			}
			if got == 0 {
				break
			}
			from = last + 1
		}
		for _, name := range idle {
			ok, err := sw.idle(ctx, name, cutoff)
			if err != nil {
				return erased, true, err
			}
			if !ok {
				continue
			}
			if err := sw.s.Erase(ctx, name); err != nil {
				return erased, true, err
			}
			erased = append(erased, name)
		}
	}
	return erased, true, nil
}

// idle checks a candidate again through the leader: its claim and both
// heads (writes stamp the head, not the claim) are older than cutoff.
func (sw *Sweeper) idle(ctx context.Context, name string, cutoff int64) (bool, error) {
	rec, err := sw.s.Mailbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.LastActive >= cutoff {
		return false, nil
	}
	for _, dir := range []byte{'p', 'c'} {
		h, err := sw.s.State(ctx, name, dir)
		if err != nil {
			return false, err
		}
		if h.Active >= cutoff {
			return false, nil
		}
	}
	return true, nil
}
