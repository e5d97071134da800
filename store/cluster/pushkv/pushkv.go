// Package pushkv is the push gateway's key store in cluster mode: the
// store.PushGatewayStore of one scope, kept in NATS JetStream so that every
// node behind the load balancer enforces the same keys, claims and limits
// (CLUSTER.md §4.4). The handler (fastpath/pushgw) cannot tell it from the
// Pebble store; both pass store/storetest's contract suite.
//
// Where each part lives, and why:
//
//   - API keys: KV er_push_keys, <scope>.<key id> -> the record as the
//     Pebble store encodes it (store.EncodePushKey). Every node mirrors
//     them into a local map through one KV watcher, so the send path's
//     KeyByHash stays a local, allocation-free lookup and a revoke or
//     disable written through any node reaches the others in milliseconds.
//     A write also applies to the writer's own map at once, by revision, so
//     an operator's revoke holds on its node before it returns. A watch
//     that stops delivering (its consumer's server went away) is replaced,
//     and until then the watch's health check reads what the mirror lacks
//     from the stream's leader (watch.go).
//   - Minute limits (the handler's per-key send limit and per-address
//     registration limit, one family per mount): KV er_push_rl,
//     <scope>.<family>.<sha256 hex> -> the GCRA theoretical arrival time
//     (the same algorithm as the in-process buckets), changed by
//     compare-and-set on every take: exact across nodes. Records expire two
//     minutes after their last write, by which time the bucket is full
//     again anyway. The time is the taking node's clock: nodes' clocks must
//     agree (NTP) for the limit to be the configured one, as for the 60 s
//     rule below.
//   - Device-token claims: KV er_push_claims, <scope>.<sha256 hex of the
//     token> -> owner, claimed-at, confirmed and the sends in flight, each
//     {id, node, incarnation, started}. Every transition is a
//     compare-and-set, so the claims of one token are serialized across
//     nodes. In-flight entries of a node incarnation that cluster.Alive
//     reports gone (a crash, a stop: about 10 s) are pruned, and so are
//     entries older than flightMax (a settle whose write failed): a dead
//     request never pins a token. Pruning the last entry of an unconfirmed
//     claim releases it, as that request's own failed settle would have.
//     The 60 s rule uses the claiming node's clock, as the Pebble store
//     does.
//   - Daily budget: a JetStream counter stream (ADR-49, allow_msg_counter),
//     subject er.push.budget.<scope>.<UTC day>. A draw adds 1 and reads the
//     new total from the ack; over the limit it subtracts 1 again and
//     refuses. Every admitted draw saw a total at or below the limit, so the
//     gateway never over-admits; a refused draw's +1 may make a concurrent
//     one refuse early until its -1 lands. No CAS, so no retries under load.
//   - /register: KV er_push_reg, <scope>.<sha256 hex of the slot> -> key id.
//     The slot is pointed at the new key id by compare-and-set, the key is
//     written, the slot's previous key is deleted, and the slot is read
//     again: if a later registration took it before this key existed (and
//     so found nothing to delete), this key deletes itself. Every key but
//     the slot's last is thus deleted by its successor or by itself: of
//     racing registrations exactly one survives. (A crash between writing
//     the key and reading the slot again, while another registration for
//     the same address races it, can leave a second key; nothing else can.)
//     The key is never visible disabled, so a server that registers
//     through one node and sends through another is not refused.
//   - A key looked up and not found in the mirror may have been written
//     through another node a moment ago: the lookup then waits until the
//     mirror has caught up with the bucket (one request to the stream's
//     leader for its last revision, shared by every miss that waits at the
//     same time, bounded by missWait) and looks again. A watch that has not
//     delivered up to that revision within watchGrace (a loaded node's
//     watch has lagged more than a second) is not waited for: the catch-up
//     reads the missing revisions from the leader itself. Hits cost
//     nothing.
//
// KV keys hold only hex digests, relay-minted ids and the scope letter; the
// API keys and device tokens themselves are never stored.
//
// Every failure of the shared store is returned wrapping
// store.ErrUnavailable (503 with Retry-After at the handler).
package pushkv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Buckets and the budget stream.
const (
	keysBucket   = "er_push_keys"
	rateBucket   = "er_push_rl"
	claimsBucket = "er_push_claims"
	regBucket    = "er_push_reg"

	budgetStream  = "ER_PUSH_BUDGET"
	budgetSubject = "er.push.budget"
	// budgetMaxAge drops a day's counter once no draw has touched it for
	// two days: the day is over by then.
	budgetMaxAge = 48 * time.Hour

	// rateMaxAge is past the longest a minute bucket takes to refill.
	rateMaxAge = 2 * time.Minute

	// flightMax bounds how long an in-flight entry of a live node counts:
	// far past any send (the provider clients time out well within it), so
	// only an entry whose settle could not be written is dropped by it.
	flightMax = 10 * time.Minute

	// casRounds bounds the compare-and-set loops of this package.
	casRounds = 32
)

// Gateway is one scope's push-gateway key store on one node. Open one per
// scope per node; Close stops its key watcher.
type Gateway struct {
	c      *cluster.Cluster
	js     jetstream.JetStream
	scope  store.PushScope
	prefix string // "<scope letter>."

	keys, rate, claims, reg jetstream.KeyValue
	budget                  jetstream.Stream

	keysStream jetstream.Stream // the keys bucket's stream, for the watch's health check
	stop       chan struct{}
	closing    sync.Once

	// afterSlot, set only by tests, runs between a registration's slot
	// write and its key write: where a racing registration can slip in.
	afterSlot func()

	// Lookups that missed wait for the mirror in rounds (catchUp).
	syncMu      sync.Mutex
	syncNext    *catchUpRound
	syncRunning bool
	bg          sync.WaitGroup // the watch supervisor and the watchers' readers

	// The key mirror. rev is the KV revision each key id was last seen at
	// (gone: deleted at), so that the watch, a catch-up's own reads and
	// this node's own writes can apply in any order and the newest wins.
	// known is the highest revision of the bucket (any scope) at or below
	// which every record is in the mirror, delivered by the watch or read
	// by a catch-up; watchAt is the highest the watch itself delivered,
	// the supervisor's measure of its progress (a catch-up's reads must
	// not hide a stalled watch: a revocation of a key the mirror holds is
	// never a miss, so only the watch brings it).
	mu      sync.RWMutex
	byHash  map[store.Hash]*store.PushKey
	byID    map[string]*mirrored
	gone    map[string]uint64
	known   uint64
	watchAt uint64

	// watchHold is held (written) by tests to stall the watch's delivery,
	// as a loaded or partitioned node stalls it; the readers take it for
	// reading around each entry.
	watchHold sync.RWMutex
}

type mirrored struct {
	key store.PushKey
	rev uint64
}

var _ store.PushGatewayStore = (*Gateway)(nil)

// New opens scope's key store on the node c: it creates (or binds) the
// buckets and the budget stream and returns once the key mirror holds every
// key the cluster has.
func New(ctx context.Context, c *cluster.Cluster, scope store.PushScope) (*Gateway, error) {
	switch scope {
	case store.PushScopeShared, store.PushScopeFCM, store.PushScopeAPNs:
	default:
		return nil, fmt.Errorf("pushkv: unknown push gateway scope %q", byte(scope))
	}
	g := &Gateway{
		c: c, js: c.JetStream(), scope: scope, prefix: string(rune(scope)) + ".",
		byHash: make(map[store.Hash]*store.PushKey), byID: make(map[string]*mirrored), gone: make(map[string]uint64),
		stop: make(chan struct{}),
	}
	var err error
	for _, b := range []struct {
		kv  *jetstream.KeyValue
		cfg cluster.BucketConfig
	}{
		{&g.keys, cluster.BucketConfig{Name: keysBucket}},
		{&g.rate, cluster.BucketConfig{Name: rateBucket, MaxAge: rateMaxAge}},
		{&g.claims, cluster.BucketConfig{Name: claimsBucket}},
		{&g.reg, cluster.BucketConfig{Name: regBucket}},
	} {
		if *b.kv, err = c.Bucket(ctx, b.cfg); err != nil {
			return nil, fmt.Errorf("pushkv: %w", cluster.Fail("open bucket "+b.cfg.Name, err))
		}
	}
	if g.budget, err = c.EnsureStream(ctx, jetstream.StreamConfig{
		Name:              budgetStream,
		Subjects:          []string{budgetSubject + ".>"},
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas(),
		MaxAge:            budgetMaxAge,
		MaxMsgsPerSubject: 1, // a counter's value is its last message
		AllowMsgCounter:   true,
		// Reads of the total go to the leader: read-after-write (see
		// cluster.Bucket on AllowDirect).
		AllowDirect: false,
	}); err != nil {
		return nil, fmt.Errorf("pushkv: %w", cluster.Fail("open stream "+budgetStream, err))
	}
	if err := g.startWatch(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// Close stops the key watch; the mirror keeps what it has. A second
// Close does nothing.
func (g *Gateway) Close() error {
	g.closing.Do(func() { close(g.stop) })
	g.bg.Wait()
	return nil
}

// op is a context for one operation on the shared store. A node that knows
// it has no quorum answers at once instead of waiting out the timeout.
func (g *Gateway) op() (context.Context, context.CancelFunc, error) {
	if err := g.c.Unavailable(); err != nil {
		return nil, nil, err
	}
	ctx, cancel := cluster.Context()
	return ctx, cancel, nil
}

// newRef is a fresh random name (in-flight entries).
func newRef() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// deleteKV writes a delete marker for key, if it is still at revision rev
// (0: whatever it holds), and returns the marker's revision. It is what
// KeyValue.Delete does, but that does not report the revision, which the
// key mirror orders by.
func (g *Gateway) deleteKV(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) (uint64, error) {
	m := nats.NewMsg("$KV." + kv.Bucket() + "." + key)
	m.Header.Set("KV-Operation", "DEL")
	if rev != 0 {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	}
	ack, err := g.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// casLoop runs round until it reports done or fails with a non-conflict
// error, spreading colliding writers with a jittered pause.
func casLoop(what string, round func() (done bool, err error)) error {
	for i := 0; i < casRounds; i++ {
		done, err := round()
		if err != nil {
			if cluster.Conflict(err) {
				sleepJitter(i)
				continue
			}
			return err
		}
		if done {
			return nil
		}
		sleepJitter(i)
	}
	return cluster.Fail(what, fmt.Errorf("%d compare-and-set conflicts in a row", casRounds))
}

func sleepJitter(round int) {
	var b [1]byte
	_, _ = rand.Read(b[:])
	time.Sleep(time.Duration(int(b[0])%(round+1)+1) * 200 * time.Microsecond)
}

// ---- keys ----

func (g *Gateway) keyKey(id string) string { return g.prefix + id }

// applyOwn applies this node's own acknowledged write at once.
func (g *Gateway) applyOwn(id string, rev uint64, k *store.PushKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rev <= g.known {
		return // the watch or a catch-up has applied it, or something newer
	}
	g.apply(id, rev, k)
}

// apply sets the mirror's id to k (nil: deleted) at rev, unless it already
// holds a newer revision. The caller holds mu.
func (g *Gateway) apply(id string, rev uint64, k *store.PushKey) {
	cur := g.byID[id]
	if (cur != nil && cur.rev >= rev) || g.gone[id] >= rev {
		return
	}
	if cur != nil {
		delete(g.byHash, cur.key.Hash)
	}
	if k == nil {
		delete(g.byID, id)
		g.gone[id] = rev
		return
	}
	delete(g.gone, id)
	m := &mirrored{key: *k, rev: rev}
	g.byID[id] = m
	g.byHash[k.Hash] = &m.key
}

// KeyByHash returns the key whose text hashes to h, from the mirror: a
// read lock and a copy, no allocation. A miss waits for the mirror to
// catch up (catchUp) and looks again, so that a key written through
// another node a moment ago is found.
func (g *Gateway) KeyByHash(h store.Hash) (store.PushKey, bool) {
	if k, ok := g.byHashLocal(h); ok {
		return k, true
	}
	g.catchUp()
	return g.byHashLocal(h)
}

func (g *Gateway) byHashLocal(h store.Hash) (store.PushKey, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if k := g.byHash[h]; k != nil {
		return *k, true
	}
	return store.PushKey{}, false
}

// KeyByID returns the key with id, from the mirror; a miss waits as in
// KeyByHash.
func (g *Gateway) KeyByID(id string) (store.PushKey, bool) {
	if k, ok := g.byIDLocal(id); ok {
		return k, true
	}
	g.catchUp()
	return g.byIDLocal(id)
}

func (g *Gateway) byIDLocal(id string) (store.PushKey, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if m := g.byID[id]; m != nil {
		return m.key, true
	}
	return store.PushKey{}, false
}

// Keys lists every key of the mirror, oldest first, once the mirror has
// caught up with the bucket: the operator's list right after a create or
// revoke through another node shows it (a listing is rare; one leader
// round trip is its cost).
func (g *Gateway) Keys() []store.PushKey {
	g.catchUp()
	g.mu.RLock()
	out := make([]store.PushKey, 0, len(g.byID))
	for _, m := range g.byID {
		out = append(out, m.key)
	}
	g.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// AddKey stores a new key; it is known to every node once the watchers
// deliver it, and to this one when AddKey returns.
func (g *Gateway) AddKey(k store.PushKey) error {
	if k.ID == "" {
		return errors.New("pushkv: push key without id")
	}
	if _, ok := g.byHashLocal(k.Hash); ok {
		return store.ErrPushKeyExists
	}
	raw, err := store.EncodePushKey(k)
	if err != nil {
		return err
	}
	ctx, cancel, err := g.op()
	if err != nil {
		return err
	}
	defer cancel()
	rev, err := g.keys.Create(ctx, g.keyKey(k.ID), raw)
	if err != nil {
		if cluster.Conflict(err) {
			return store.ErrPushKeyExists
		}
		return cluster.Fail("add push key", err)
	}
	g.applyOwn(k.ID, rev, &k)
	return nil
}

func (g *Gateway) slotKey(k *store.PushKey) string {
	h := sha256.Sum256([]byte(k.Slot()))
	return g.prefix + hex.EncodeToString(h[:])
}

// RegisterKey stores a new self-registered key for its address slot and
// deletes the key that slot had (see the package comment for the order of
// writes). It returns the superseded key, if there was one.
func (g *Gateway) RegisterKey(k store.PushKey) (*store.PushKey, error) {
	if k.RegisteredIP == "" {
		return nil, errors.New("pushkv: a registered key needs its address bucket")
	}
	if k.ID == "" {
		return nil, errors.New("pushkv: push key without id")
	}
	if _, ok := g.byHashLocal(k.Hash); ok {
		return nil, store.ErrPushKeyExists
	}
	raw, err := store.EncodePushKey(k)
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := g.op()
	if err != nil {
		return nil, err
	}
	defer cancel()
	slot := g.slotKey(&k)
	// 1. The slot names the new key, before the key exists.
	var prev string
	if _, err := cluster.Update(ctx, g.reg, slot, func(cur []byte, _ uint64) ([]byte, error) {
		prev = string(cur)
		return []byte(k.ID), nil
	}); err != nil {
		return nil, fmt.Errorf("pushkv: register push key: %w", err)
	}
	if g.afterSlot != nil {
		g.afterSlot()
	}
	// 2. The key.
	rev, err := g.keys.Create(ctx, g.keyKey(k.ID), raw)
	if err != nil {
		if cluster.Conflict(err) {
			return nil, store.ErrPushKeyExists
		}
		return nil, cluster.Fail("register push key", err)
	}
	// 3. The key the slot named before goes.
	var superseded *store.PushKey
	if prev != "" && prev != k.ID {
		if superseded, err = g.deleteRecord(ctx, prev); err != nil {
			return nil, err
		}
	}
	// 4. A registration that took the slot between 1 and 2 found no key
	// of ours to delete: then this one goes itself, as if superseded.
	e, err := g.reg.Get(ctx, slot)
	switch {
	case err != nil && !cluster.Absent(err):
		return nil, cluster.Fail("read address slot", err)
	case err != nil || string(e.Value()) != k.ID:
		if _, err := g.deleteRecord(ctx, k.ID); err != nil {
			return nil, err
		}
		return superseded, nil
	}
	g.applyOwn(k.ID, rev, &k)
	return superseded, nil
}

// deleteRecord deletes the key record id, whatever revision it is at, and
// returns the key it held (nil if there was none).
func (g *Gateway) deleteRecord(ctx context.Context, id string) (*store.PushKey, error) {
	var old *store.PushKey
	err := casLoop("delete push key", func() (bool, error) {
		e, err := g.keys.Get(ctx, g.keyKey(id))
		switch {
		case cluster.Absent(err):
			old = nil
			return true, nil
		case err != nil:
			return false, cluster.Fail("read push key", err)
		}
		k, err := store.DecodePushKey(e.Value())
		if err != nil {
			return false, err
		}
		rev, err := g.deleteKV(ctx, g.keys, g.keyKey(id), e.Revision())
		if err != nil {
			if cluster.Conflict(err) {
				return false, err
			}
			return false, cluster.Fail("delete push key", err)
		}
		old = &k
		g.applyOwn(id, rev, nil)
		return true, nil
	})
	return old, err
}

// SetKeyEnabled enables or disables the key id.
func (g *Gateway) SetKeyEnabled(id string, enabled bool) error {
	ctx, cancel, err := g.op()
	if err != nil {
		return err
	}
	defer cancel()
	var k store.PushKey
	changed := false
	rev, err := cluster.Update(ctx, g.keys, g.keyKey(id), func(cur []byte, _ uint64) ([]byte, error) {
		if cur == nil {
			return nil, store.ErrUnknownPushKey
		}
		var err error
		if k, err = store.DecodePushKey(cur); err != nil {
			return nil, err
		}
		if k.Enabled == enabled {
			changed = false
			return nil, cluster.ErrSkip
		}
		k.Enabled, changed = enabled, true
		return store.EncodePushKey(k)
	})
	if err != nil {
		return err
	}
	if changed {
		g.applyOwn(id, rev, &k)
	}
	return nil
}

// DeleteKey revokes the key id: its record goes, and a self-registered
// key's address slot is freed if it still points at it.
func (g *Gateway) DeleteKey(id string) error {
	ctx, cancel, err := g.op()
	if err != nil {
		return err
	}
	defer cancel()
	old, err := g.deleteRecord(ctx, id)
	if err != nil {
		return err
	}
	if old == nil {
		return store.ErrUnknownPushKey
	}
	if old.RegisteredIP == "" {
		return nil
	}
	slot := g.slotKey(old)
	return casLoop("free address slot", func() (bool, error) {
		e, err := g.reg.Get(ctx, slot)
		switch {
		case cluster.Absent(err):
			return true, nil
		case err != nil:
			return false, cluster.Fail("read address slot", err)
		case string(e.Value()) != id:
			return true, nil // a later registration holds it
		}
		if _, err := g.deleteKV(ctx, g.reg, slot, e.Revision()); err != nil {
			if cluster.Conflict(err) {
				return false, err
			}
			return false, cluster.Fail("free address slot", err)
		}
		return true, nil
	})
}
