package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
)

// BucketConfig is one KV bucket of a service's backend.
type BucketConfig struct {
	// Name is the bucket ("er_chan_keys"); KV keys in it are
	// [-/_=.a-zA-Z0-9]+.
	Name string
	// KeyTTL allows per-key TTLs (leases): kv.Create with jetstream.KeyTTL,
	// and refreshes by a direct publish with Nats-TTL (CLUSTER.md §1.3).
	KeyTTL bool
	// MaxAge expires every record this long after its last write (0: never).
	MaxAge time.Duration
}

// Bucket creates (or updates to this configuration) a KV bucket with the
// cluster's replicas on file storage and binds it.
//
// The bucket's stream is made here rather than by CreateKeyValue for one
// setting: AllowDirect is off. Direct Get may answer from a follower that
// has not applied the latest write yet (ADR-31), so a record written
// through node A could read as absent through node B a moment later;
// without it every Get goes to the stream leader, which answers after
// every acknowledged write. The rest matches what nats.go's
// CreateKeyValue makes (jetstream/kv.go), so the bucket works with every
// KV client and the nats CLI.
func (c *Cluster) Bucket(ctx context.Context, b BucketConfig) (jetstream.KeyValue, error) {
	sc := c.bucketStream(b)
	if err := c.retry(ctx, "create bucket "+b.Name, func(ctx context.Context) error {
		_, err := c.createOrUpdate(ctx, sc)
		return err
	}); err != nil {
		return nil, err
	}
	var kv jetstream.KeyValue
	err := c.retry(ctx, "bind bucket "+b.Name, func(ctx context.Context) (err error) {
		kv, err = c.js.KeyValue(ctx, b.Name)
		return err
	})
	return kv, err
}

// EnsureStream creates a stream, or updates it to sc, retrying like Bucket
// does while a cluster that just started cannot place it yet.
func (c *Cluster) EnsureStream(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	var st jetstream.Stream
	err := c.retry(ctx, "create stream "+sc.Name, func(ctx context.Context) (err error) {
		st, err = c.createOrUpdate(ctx, sc)
		return err
	})
	return st, err
}

// createOrUpdate makes the stream sc, or brings an existing one to sc. It
// creates first: the servers answer concurrent creates of one stream with
// the same config (every node starting at once) at once, where nats.go's
// CreateOrUpdateStream, which updates first, went unanswered until its
// timeout for each node (measured: 3 nodes, every stream's first attempt
// timed out, 5 s each, a minute for the mailbox's 12 shards).
func (c *Cluster) createOrUpdate(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := c.js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return c.js.UpdateStream(ctx, sc)
	}
	return st, err
}

// Stream binds the stream of a bucket made by Bucket (for leader reads by
// sequence, purges and info), retrying like Bucket: right after the bucket
// is created its stream's info may not answer yet.
func (c *Cluster) Stream(ctx context.Context, bucket string) (jetstream.Stream, error) {
	var st jetstream.Stream
	err := c.retry(ctx, "bind stream of "+bucket, func(ctx context.Context) (err error) {
		st, err = c.js.Stream(ctx, "KV_"+bucket)
		return err
	})
	return st, err
}

// bucketStream is the stream of a KV bucket (see Bucket).
func (c *Cluster) bucketStream(b BucketConfig) jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:              "KV_" + b.Name,
		Subjects:          []string{"$KV." + b.Name + ".>"},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          c.replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        2 * time.Minute,
		Discard:           jetstream.DiscardNew,
		AllowDirect:       false,
	}
	if b.KeyTTL {
		sc.AllowMsgTTL = true
		sc.SubjectDeleteMarkerTTL = time.Second
	}
	if b.MaxAge > 0 {
		sc.MaxAge = b.MaxAge
		sc.Duplicates = min(sc.Duplicates, b.MaxAge)
	}
	return sc
}

// retry runs op until it succeeds or ctx ends: right after a cluster starts,
// creating an R3 stream fails for a while ("insufficient resources", no
// meta leader yet) until every server has joined.
func (c *Cluster) retry(ctx context.Context, what string, op func(context.Context) error) error {
	for {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		err := op(octx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s: %w", what, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Conflict reports whether err is a lost compare-and-set: the key changed
// (10071, which nats.go reports as ErrKeyExists for Create), or another
// write to the same key was in flight in Raft (10164, refused at once on
// replicated streams even when it would have succeeded a moment later).
func Conflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return errors.Is(err, jetstream.ErrKeyExists)
}

// Absent reports whether err says the key holds no value.
func Absent(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
}

// Fail wraps an error of the shared store for a service: a NATS or
// JetStream failure (timeout, no quorum, disconnected) becomes
// store.ErrUnavailable, which every service answers 503 with Retry-After,
// exactly as for a full disk in single-node mode. A write that failed this
// way may still have been applied (its ack was lost): every write of the
// relay is a compare-and-set or idempotent, so the client's retry settles it.
func Fail(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, store.ErrUnavailable) {
		return fmt.Errorf("cluster: %s: %w", op, err)
	}
	return fmt.Errorf("cluster: %s: %w: %w", op, store.ErrUnavailable, err)
}

// maxCASRounds bounds a compare-and-set loop: one key is changed by one
// request at a time in practice, so more rounds than this means a storm of
// writers on one key, answered 503 rather than spun on.
const maxCASRounds = 32

// ErrSkip returned by an Update function leaves the key as it is.
var ErrSkip = errors.New("cluster: no change")

// Update changes the value at key by compare-and-set: fn gets the current
// value (nil and revision 0 when the key holds none) and returns the new one;
// a conflict re-reads and calls fn again. fn returning ErrSkip ends the
// update without a write (Update returns nil); any other error ends it with
// that error. Reads go to the stream leader (see Bucket), so a conflict is
// a real concurrent write, not a stale read.
func Update(ctx context.Context, kv jetstream.KeyValue, key string, fn func(cur []byte, rev uint64) ([]byte, error)) (uint64, error) {
	for round := 0; round < maxCASRounds; round++ {
		var cur []byte
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case err == nil:
			cur, rev = e.Value(), e.Revision()
		case errors.Is(err, jetstream.ErrKeyDeleted):
			rev = e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return 0, Fail("read "+key, err)
		}
		next, err := fn(cur, rev)
		if errors.Is(err, ErrSkip) {
			return rev, nil
		}
		if err != nil {
			return 0, err
		}
		var nrev uint64
		if rev == 0 {
			nrev, err = kv.Create(ctx, key, next)
		} else {
			nrev, err = kv.Update(ctx, key, next, rev)
		}
		if err == nil {
			return nrev, nil
		}
		if !Conflict(err) {
			return 0, Fail("write "+key, err)
		}
		// Writers that collided would collide again at once: spread them.
		time.Sleep(time.Duration(rand.Int64N(int64(round+1) * int64(time.Millisecond))))
	}
	return 0, Fail("write "+key, fmt.Errorf("%d compare-and-set conflicts in a row", maxCASRounds))
}

// Delete removes key if it still holds revision rev (0: whatever it holds).
func Delete(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	if err := kv.Delete(ctx, key, opts...); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if Conflict(err) {
			return err
		}
		return Fail("delete "+key, err)
	}
	return nil
}

// Get reads key from the leader: its entry, or nil when it holds no value
// (absent or deleted); a failure of the store is Fail's.
func Get(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	e, err := kv.Get(ctx, key)
	if Absent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, Fail("read "+key, err)
	}
	return e, nil
}

// Value is an entry's value, nil for no entry.
func Value(e jetstream.KeyValueEntry) []byte {
	if e == nil {
		return nil
	}
	return e.Value()
}

// listWorkers bounds the reads a listing has in flight: a list of thousands
// of records takes its round trips side by side rather than one after the
// other (0.15 ms each through another node), within one operation timeout.
const listWorkers = 8

// Each calls fn for every index below n with at most listWorkers calls at
// once, and returns the first error.
func Each(n int, fn func(i int) error) error {
	sem := make(chan struct{}, listWorkers)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}
