package mailboxjs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Config of the mailbox streams; every node must use the same.
type Config struct {
	// Shards is the number of ER_MBX_<k> streams (default 12: 4 per
	// server of a 3-server cluster, so that leaders spread).
	Shards int
	// MaxBytes caps each shard stream (0: unlimited). The stream discards
	// new messages when full, so a full stream refuses (503) rather than
	// evicting acknowledged envelopes.
	MaxBytes int64
	// HeadCache bounds the heads a node keeps to write without reading
	// first (default 4096 directions).
	HeadCache int
}

// Store is the mailbox's JetStream backend on one node.
type Store struct {
	c      *cluster.Cluster
	nc     *nats.Conn
	js     jetstream.JetStream
	shards int

	streams []jetstream.Stream

	mu    sync.Mutex
	heads map[string]Head // name + dir -> the last head this node wrote or read
	capN  int
}

// Open creates (or updates) the shard streams and returns the backend.
func Open(ctx context.Context, c *cluster.Cluster, cfg Config) (*Store, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = 12
	}
	if cfg.HeadCache <= 0 {
		cfg.HeadCache = 4096
	}
	s := &Store{c: c, nc: c.Conn(), js: c.JetStream(), shards: cfg.Shards, heads: make(map[string]Head), capN: cfg.HeadCache}
	for k := range cfg.Shards {
		// EnsureStream retries: right after start an R3 stream cannot be
		// placed until every server has joined the meta group.
		st, err := c.EnsureStream(ctx, streamConfig(k, c.Replicas(), cfg.MaxBytes))
		if err != nil {
			return nil, cluster.Fail("create stream "+streamName(k), err)
		}
		s.streams = append(s.streams, st)
	}
	return s, nil
}

// streamConfig is shard k's stream.
func streamConfig(k, replicas int, maxBytes int64) jetstream.StreamConfig {
	if maxBytes <= 0 {
		maxBytes = -1
	}
	prefix := fmt.Sprintf("mbx.%d", k)
	return jetstream.StreamConfig{
		Name:              streamName(k),
		Subjects:          []string{prefix + ".>"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		Discard:           jetstream.DiscardNew,
		MaxBytes:          maxBytes,
		MaxMsgs:           -1,
		MaxMsgsPerSubject: -1,
		MaxAge:            0, // idle expiry is the sweeper's
		AllowRollup:       true,
		AllowDirect:       true,
		// Atomic batches are not used by the writes (see the package
		// doc); allowed so that an operator's tooling and the benchmark's
		// batch model can use them on the same streams.
		AllowAtomicPublish: true,
		Duplicates:         2 * time.Minute,
		RePublish: &jetstream.RePublish{
			Source:      prefix + ".*.*.*.>",
			Destination: "er.w.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.>",
		},
	}
}

// Shard is the ER_MBX_<k> stream that keeps name.
func (s *Store) Shard(name string) (int, error) {
	n, err := s.names(name)
	return n.shard, err
}

// bounded gives ctx the store's operation timeout when it has no deadline
// of its own (a request that would otherwise wait forever on a lost
// server).
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 5*time.Second)
}

// --- the head cache ----------------------------------------------------

func cacheKey(name string, dir byte) string { return name + "/" + string(dir) }

func cloneHead(h Head) Head {
	h.Stored = slices.Clone(h.Stored)
	h.OutOfOrder = slices.Clone(h.OutOfOrder)
	return h
}

func (s *Store) cached(name string, dir byte) (Head, bool) {
	s.mu.Lock()
	h, ok := s.heads[cacheKey(name, dir)]
	s.mu.Unlock()
	if !ok {
		return Head{}, false
	}
	return cloneHead(h), true
}

func (s *Store) remember(name string, dir byte, h Head) {
	k := cacheKey(name, dir)
	s.mu.Lock()
	if cur, ok := s.heads[k]; !ok || cur.Rev <= h.Rev || h.Rev == 0 {
		if !ok && len(s.heads) >= s.capN {
			for victim := range s.heads { // Go's map order is random: a random victim
				delete(s.heads, victim)
				break
			}
		}
		s.heads[k] = cloneHead(h)
	}
	s.mu.Unlock()
}

func (s *Store) forget(name string) {
	s.mu.Lock()
	delete(s.heads, cacheKey(name, 'p'))
	delete(s.heads, cacheKey(name, 'c'))
	s.mu.Unlock()
}

// readHead reads a direction's head through the stream leader.
func (s *Store) readHead(ctx context.Context, n names, dir byte) (Head, error) {
	m, err := s.leaderGet(ctx, n.stream, getReq{LastFor: n.dirAll(dir)})
	if errors.Is(err, errNoMsg) {
		return Head{}, nil
	}
	if err != nil {
		return Head{}, err
	}
	h, err := decodeHead(m.hdr.Get(hdrHead), m.seq)
	if err != nil {
		return Head{}, fmt.Errorf("mailboxjs: head of %s at %d: %w", n.dirAll(dir), m.seq, err)
	}
	return h, nil
}

// State reads a direction's head through the stream leader (HEAD …/<dir>
// answers First, Last and Count from it).
func (s *Store) State(ctx context.Context, name string, dir byte) (Head, error) {
	n, err := s.names(name)
	if err != nil {
		return Head{}, err
	}
	h, err := s.readHead(ctx, n, dir)
	if err == nil {
		s.remember(name, dir, h)
	}
	return h, err
}

// --- claims --------------------------------------------------------------

// ClaimOutcome is the answer to a claim: 201, 204 or 409.
type ClaimOutcome int

const (
	ClaimCreated ClaimOutcome = iota + 1 // 201: a new mailbox with this token
	ClaimSame                            // 204: already this token's (activity moved when due)
	ClaimTaken                           // 409: another token holds it
)

// Claim creates the mailbox for token if it has no claim record (one
// winner across nodes: create-if-absent) or only an expired one (no claim
// and no write for idle: taken over by compare-and-set after what the old
// holder left is purged), or answers whether token holds it; a holder's
// claim moves LastActive when touchEvery has passed since the stored one
// (so heartbeats cost a write an hour, not one each).
func (s *Store) Claim(ctx context.Context, name string, token store.Hash, now int64, touchEvery, idle time.Duration) (ClaimOutcome, error) {
	o, _, err := s.claim(ctx, name, token, now, touchEvery, idle)
	return o, err
}

// claim is Claim that also reports the LastActive the record holds after
// it (a node's cache of the record starts from it).
func (s *Store) claim(ctx context.Context, name string, token store.Hash, now int64, touchEvery, idle time.Duration) (ClaimOutcome, int64, error) {
	n, err := s.names(name)
	if err != nil {
		return 0, 0, err
	}
	for round := range maxRounds {
		rec, rev, err := s.readClaim(ctx, n)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return 0, 0, err
		}
		exists := err == nil
		if exists && now-rec.LastActive > int64(idle) {
			// The record looks expired; writes stamp their head, not it.
			if exists, err = s.live(ctx, n, now, idle); err != nil {
				return 0, 0, err
			}
			if exists {
				rec.LastActive = 0 // alive through writes: a heartbeat is due
			}
		}
		switch {
		case exists && rec.Token != token:
			return ClaimTaken, rec.LastActive, nil
		case exists && now-rec.LastActive < int64(touchEvery):
			return ClaimSame, rec.LastActive, nil
		case exists: // a heartbeat that moves LastActive
			_, err = s.publish(ctx, n.claim(), claimBody(token, now), nats.Header{
				hdrExpSeq: {strconv.FormatUint(rev, 10)}, hdrRollup: {"sub"},
			})
			if err == nil {
				return ClaimSame, now, nil
			}
		case rev != 0:
			// An expired holder: purge what it left before the takeover,
			// so that once the new claim is there nothing of the old
			// holder's can be read (the claim's revision does not move),
			// and end its watchers and sockets on every node, as an erase
			// does. Told before the new claim exists, so that no watcher
			// of the new holder can see it.
			if err := s.purgeLeftovers(ctx, n); err != nil {
				return 0, 0, err
			}
			s.forget(name)
			// It names the expired claim's revision: a watch of the new
			// holder (a later claim) that the notice reaches late keeps
			// running.
			notice := &nats.Msg{Subject: n.control(), Data: []byte(ctlErased), Header: nats.Header{hdrClaimRev: {strconv.FormatUint(rev, 10)}}}
			if err := s.nc.PublishMsg(notice); err != nil {
				return 0, 0, cluster.Fail("claim "+name+": notify", err)
			}
			_, err = s.publish(ctx, n.claim(), claimBody(token, now), nats.Header{
				hdrExpSeq: {strconv.FormatUint(rev, 10)}, hdrRollup: {"sub"},
			})
			if err == nil {
				return ClaimCreated, now, nil
			}
		default: // no claim: create-if-absent, one winner
			_, err = s.publish(ctx, n.claim(), claimBody(token, now), nats.Header{hdrExpSeq: {"0"}})
			if err == nil {
				// Whatever a previous holder's writes left in a race with
				// its erase goes before anyone reads it.
				if err := s.purgeLeftovers(ctx, n); err != nil {
					return 0, 0, err
				}
				return ClaimCreated, now, nil
			}
		}
		if !cluster.Conflict(err) {
			return 0, 0, err
		}
		backoff(round)
	}
	return 0, 0, cluster.Fail("claim "+name, errors.New("too many conflicts"))
}

// live reports whether either direction was written within idle (writes
// stamp their head, not the claim record).
func (s *Store) live(ctx context.Context, n names, now int64, idle time.Duration) (bool, error) {
	for _, dir := range []byte{'p', 'c'} {
		h, err := s.readHead(ctx, n, dir)
		if err != nil {
			return false, err
		}
		if now-h.Active <= int64(idle) {
			return true, nil
		}
	}
	return false, nil
}

// lastWrite is the time of the latest write of either direction (writes
// stamp their head, not the claim record); 0 when none.
func (s *Store) lastWrite(ctx context.Context, n names) (int64, error) {
	var last int64
	for _, dir := range []byte{'p', 'c'} {
		h, err := s.readHead(ctx, n, dir)
		if err != nil {
			return 0, err
		}
		last = max(last, h.Active)
	}
	return last, nil
}

// Touch moves a mailbox's LastActive forward to now (a write's restart of
// the idle timer, persisted as rarely as the caller likes: the handler
// does it once per touchEvery, as for Pebble); nothing when the record is
// gone or already at or past now.
func (s *Store) Touch(ctx context.Context, name string, now int64) error {
	n, err := s.names(name)
	if err != nil {
		return err
	}
	for round := range maxRounds {
		rec, rev, err := s.readClaim(ctx, n)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if rec.LastActive >= now {
			return nil
		}
		_, err = s.publish(ctx, n.claim(), claimBody(rec.Token, now), nats.Header{
			hdrExpSeq: {strconv.FormatUint(rev, 10)}, hdrRollup: {"sub"},
		})
		if !cluster.Conflict(err) {
			return err
		}
		backoff(round)
	}
	return cluster.Fail("touch "+name, errors.New("too many conflicts"))
}

// Mailbox reads a mailbox's claim record; store.ErrNotFound when none.
func (s *Store) Mailbox(ctx context.Context, name string) (store.MailboxRecord, error) {
	n, err := s.names(name)
	if err != nil {
		return store.MailboxRecord{}, err
	}
	rec, _, err := s.readClaim(ctx, n)
	return rec, err
}

func (s *Store) readClaim(ctx context.Context, n names) (store.MailboxRecord, uint64, error) {
	m, err := s.leaderGet(ctx, n.stream, getReq{LastFor: n.claim()})
	if errors.Is(err, errNoMsg) {
		return store.MailboxRecord{}, 0, store.ErrNotFound
	}
	if err != nil {
		return store.MailboxRecord{}, 0, err
	}
	if len(m.data) != store.HashLen+8 {
		return store.MailboxRecord{}, 0, fmt.Errorf("mailboxjs: claim record of %d bytes", len(m.data))
	}
	var r store.MailboxRecord
	copy(r.Token[:], m.data)
	r.LastActive = int64(binary.BigEndian.Uint64(m.data[store.HashLen:]))
	return r, m.seq, nil
}

func claimBody(token store.Hash, now int64) []byte {
	b := make([]byte, store.HashLen+8)
	copy(b, token[:])
	binary.BigEndian.PutUint64(b[store.HashLen:], uint64(now))
	return b
}

func (s *Store) purgeLeftovers(ctx context.Context, n names) error {
	for _, f := range []string{n.base + ".*.>", n.push('p'), n.push('c')} {
		if err := s.streams[n.shard].Purge(ctx, jetstream.WithPurgeSubject(f)); err != nil {
			return cluster.Fail("purge "+f, err)
		}
	}
	return nil
}

// --- writes ---------------------------------------------------------------

// Limits are the per-direction bounds a Put is decided against, in the
// head, so exact across nodes.
type Limits struct {
	MaxStored, MaxStoredBytes int
	// EnvelopeBurst tokens, one back every EnvelopeEvery (0: no bucket).
	EnvelopeBurst int
	EnvelopeEvery time.Duration
	// PushBurst, PushEvery: the push bucket, charged when Notify is set.
	PushBurst int
	PushEvery time.Duration
	Notify    bool
}

// Outcome of a Put.
type Outcome int

const (
	Created     Outcome = iota + 1 // 201: stored now
	Retry                          // 200: stored before with the same bytes (push nothing)
	Conflict                       // 409: stored before with other bytes
	Pruned                         // 409: at or below the pruned mark
	Full                           // 507
	RateLimited                    // 429, RetryAfter set
	NoMailbox                      // 404: the direction's first write found no claim (erased meanwhile)
)

// PutResult is what a Put decided.
type PutResult struct {
	Outcome    Outcome
	RetryAfter time.Duration // RateLimited: when a token is back
	Push       bool          // Created with Notify and a push token taken
	Rev        uint64        // stream sequence of the stored envelope
}

// maxRounds bounds the compare-and-set loops of claims, touches and
// prunes (Put retries until its deadline instead). Each round is a
// leader read and a jittered wait.
const maxRounds = 64

// errGone: a head listed an envelope the stream no longer holds (a prune
// or erase since that head was read); decided again on a newer head.
var errGone = errors.New("mailboxjs: envelope gone since the head was read")

// Put stores one envelope of a direction, decided against its head and
// written with the new head in the envelope's own headers by one
// compare-and-set publish. An Ok answer means the envelope and the head
// are fsynced on a quorum (the streams run with sync always).
func (s *Store) Put(ctx context.Context, name string, dir byte, seq uint64, env []byte, lim Limits, now int64) (PutResult, error) {
	n, err := s.names(name)
	if err != nil {
		return PutResult{}, err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	h, fromCache := s.cached(name, dir)
	if !fromCache {
		if h, err = s.readHead(ctx, n, dir); err != nil {
			return PutResult{}, err
		}
	}
	// Conflicts are retried until ctx ends rather than a number of times:
	// a writer that just won writes its next envelope from its cached
	// head at once, so with several writers racing one direction a loser
	// can lose many rounds in a row (measured: 64 with 8 writers of 125
	// envelopes each) before the winner pauses.
	for round := 0; ; round++ {
		if err := ctx.Err(); err != nil {
			return PutResult{}, cluster.Fail("put "+name, fmt.Errorf("%d compare-and-set conflicts until the deadline: %w", round, err))
		}
		res, next, err := s.decide(ctx, n, dir, h, seq, env, lim, now)
		if errors.Is(err, errGone) {
			fromCache = false
			if h, err = s.readHead(ctx, n, dir); err != nil {
				return PutResult{}, err
			}
			continue
		}
		if err != nil {
			return PutResult{}, err
		}
		if next == nil && fromCache {
			// A cached head may be stale (another node wrote, pruned or
			// erased): only a write is checked by the server, so every
			// other answer is decided again on the leader's head.
			fromCache = false
			if h, err = s.readHead(ctx, n, dir); err != nil {
				return PutResult{}, err
			}
			continue
		}
		if next == nil {
			return res, nil
		}
		if h.Rev == 0 {
			// The direction's first write (or the first after an
			// erase): a mailbox erased since the caller checked its
			// claim must not get an envelope nobody can reach.
			if _, _, err := s.readClaim(ctx, n); errors.Is(err, store.ErrNotFound) {
				return PutResult{Outcome: NoMailbox}, nil
			} else if err != nil {
				return PutResult{}, err
			}
		}
		subject := n.inOrder(dir)
		hdr := nats.Header{
			hdrExpSeq:  {strconv.FormatUint(h.Rev, 10)},
			hdrExpSubj: {n.dirAll(dir)},
			hdrHead:    {encodeHead(next)},
		}
		if next.isOutOfOrder(seq) {
			subject = n.ooo(dir, seq)
		}
		ack, err := s.publish(ctx, subject, env, hdr)
		if err == nil {
			next.Rev = ack.Sequence
			s.remember(name, dir, *next)
			res.Rev = ack.Sequence
			return res, nil
		}
		if !cluster.Conflict(err) {
			return PutResult{}, err
		}
		backoff(round)
		fromCache = false
		if h, err = s.readHead(ctx, n, dir); err != nil {
			return PutResult{}, err
		}
	}
}

// decide answers a Put against head h: a result with next nil, or the new
// head to write.
func (s *Store) decide(ctx context.Context, n names, dir byte, h Head, seq uint64, env []byte, lim Limits, now int64) (PutResult, *Head, error) {
	if seq <= h.Pruned {
		return PutResult{Outcome: Pruned}, nil, nil
	}
	if h.Has(seq) {
		stored, ok, err := s.lookup(ctx, n, dir, &h, seq)
		if err != nil {
			return PutResult{}, nil, err
		}
		if ok {
			if bytes.Equal(stored, env) {
				return PutResult{Outcome: Retry}, nil, nil
			}
			return PutResult{Outcome: Conflict}, nil, nil
		}
		// The head lists it but it is gone: pruned or erased meanwhile;
		// the next round reads a newer head.
		return PutResult{}, nil, errGone
	}
	if (lim.MaxStored > 0 && h.Count+1 > lim.MaxStored) || (lim.MaxStoredBytes > 0 && h.Bytes+len(env) > lim.MaxStoredBytes) {
		return PutResult{Outcome: Full}, nil, nil
	}
	next := cloneHead(h)
	tat, ok, wait := gcra(h.EnvTAT, now, lim.EnvelopeBurst, int64(lim.EnvelopeEvery))
	if !ok {
		return PutResult{Outcome: RateLimited, RetryAfter: time.Duration(wait)}, nil, nil
	}
	next.EnvTAT = tat
	res := PutResult{Outcome: Created}
	if lim.Notify {
		if tat, ok, _ := gcra(h.PushTAT, now, lim.PushBurst, int64(lim.PushEvery)); ok {
			next.PushTAT, res.Push = tat, true
		}
	}
	if h.Count == 0 {
		// The first envelope kept is written after the current head.
		next.FirstStream = h.Rev + 1
	}
	next.add(seq, len(env))
	if len(next.Stored) > maxRuns || len(next.OutOfOrder) > maxOutOfOrder ||
		(len(next.Stored) > len(h.Stored) && runsEncodedSize(next.Stored) > maxRunsBytes) ||
		(len(next.OutOfOrder) > len(h.OutOfOrder) && oooEncodedSize(next.OutOfOrder) > maxOutOfOrderBytes) {
		return PutResult{Outcome: Full}, nil, nil
	}
	if !next.isOutOfOrder(seq) {
		next.CumInOrder += uint64(len(env))
	}
	next.Active = now
	return res, &next, nil
}

// publish sends one message and waits for its ack; a lost compare-and-set
// comes back as is (cluster.Conflict), anything else through cluster.Fail.
func (s *Store) publish(ctx context.Context, subject string, data []byte, hdr nats.Header) (*jetstream.PubAck, error) {
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr})
	if err != nil {
		if cluster.Conflict(err) {
			return nil, err
		}
		return nil, cluster.Fail("publish "+subject, err)
	}
	return ack, nil
}

// backoff spreads writers that collided: they would collide again at once.
func backoff(round int) {
	time.Sleep(time.Duration(rand.Int64N(int64(min(round, 8)+1) * int64(time.Millisecond))))
}

// --- reads ---------------------------------------------------------------

// Envelope returns the stored bytes of one envelope and whether it exists.
func (s *Store) Envelope(ctx context.Context, name string, dir byte, seq uint64) ([]byte, bool, error) {
	n, err := s.names(name)
	if err != nil {
		return nil, false, err
	}
	h, err := s.readHead(ctx, n, dir)
	if err != nil {
		return nil, false, err
	}
	if seq <= h.Pruned || !h.Has(seq) {
		return nil, false, nil
	}
	return s.lookup(ctx, n, dir, &h, seq)
}

// HasEnvelope reports whether seq is stored, from the head alone (read
// through the leader, so exact).
func (s *Store) HasEnvelope(ctx context.Context, name string, dir byte, seq uint64) (bool, error) {
	n, err := s.names(name)
	if err != nil {
		return false, err
	}
	h, err := s.readHead(ctx, n, dir)
	if err != nil {
		return false, err
	}
	return seq > h.Pruned && h.Has(seq), nil
}

// lookup finds a stored envelope (h lists it): an out-of-order one on its
// own subject, an in-order one by binary search over the ascending .e
// subject. Direct Get answers first (any replica); a miss goes again
// through the leader, since a replica may not have it yet.
func (s *Store) lookup(ctx context.Context, n names, dir byte, h *Head, seq uint64) ([]byte, bool, error) {
	for _, get := range []func(context.Context, string, getReq) (*msg, error){s.directGet, s.leaderGet} {
		if h.isOutOfOrder(seq) {
			m, err := get(ctx, n.stream, getReq{LastFor: n.ooo(dir, seq)})
			if err == nil {
				return m.data, true, nil
			}
			if !errors.Is(err, errNoMsg) {
				return nil, false, err
			}
			continue
		}
		m, err := s.search(ctx, get, n, dir, h, seq)
		if err != nil {
			return nil, false, err
		}
		if m != nil && m.clientSeq() == seq {
			return m.data, true, nil
		}
	}
	return nil, false, nil
}

// search returns the first in-order envelope with a client sequence at or
// above target (nil: none up to the head). The .e subject ascends in
// client sequence, so each probe halves the stream range.
func (s *Store) search(ctx context.Context, get func(context.Context, string, getReq) (*msg, error), n names, dir byte, h *Head, target uint64) (*msg, error) {
	lo, hi := max(h.FirstStream, 1), h.Rev
	var best *msg
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, err := get(ctx, n.stream, getReq{Seq: mid, NextFor: n.inOrder(dir)})
		if errors.Is(err, errNoMsg) || (err == nil && m.seq > hi) {
			hi = mid - 1
			continue
		}
		if err != nil {
			return nil, err
		}
		c := m.clientSeq()
		if c == target {
			return m, nil
		}
		if c < target {
			lo = m.seq + 1
		} else {
			best = m
			hi = mid - 1
		}
	}
	return best, nil
}

// maxLagPolls bounds how often a read waits for a lagging replica (2 ms
// each): a replica of a healthy stream applies within milliseconds.
const maxLagPolls = 2500

// scanBatchBytes bounds one Direct Get batch of a scan (the default).
const scanBatchBytes = 1 << 20

// Scan calls fn for every stored envelope of a direction with a sequence
// above after, ascending, until fn returns false (env is fn's to keep).
// It reads the state the head had when Scan began. maxBytes (0: 1 MiB)
// bounds what one read asks the servers for, so a fetch that wants 4 MiB
// does not make them send 32.
func (s *Store) Scan(ctx context.Context, name string, dir byte, after uint64, maxBytes int, fn func(seq uint64, env []byte) bool) error {
	n, err := s.names(name)
	if err != nil {
		return err
	}
	h, err := s.readHead(ctx, n, dir)
	if err != nil {
		return err
	}
	_, err = s.scan(ctx, n, dir, &h, after, maxBytes, fn)
	return err
}

// scan is Scan over head h; it reports whether fn stopped it.
func (s *Store) scan(ctx context.Context, n names, dir byte, h *Head, after uint64, maxBytes int, fn func(seq uint64, env []byte) bool) (stopped bool, err error) {
	if maxBytes <= 0 {
		maxBytes = scanBatchBytes
	}
	after = max(after, h.Pruned)
	if h.Count == 0 || after >= h.Last() {
		return false, nil
	}
	ooo := h.OutOfOrder[sort(h.OutOfOrder, after+1):]
	// emitOOO sends the out-of-order envelopes below limit.
	emitOOO := func(limit uint64) (bool, error) {
		for len(ooo) > 0 && ooo[0] < limit {
			seq := ooo[0]
			ooo = ooo[1:]
			env, ok, err := s.lookup(ctx, n, dir, h, seq)
			if err != nil {
				return false, err
			}
			if ok && !fn(seq, env) {
				return true, nil
			}
		}
		return false, nil
	}
	// The last in-order envelope is the max: every new max goes to .e.
	want := h.Max
	from := max(h.FirstStream, 1)
	if after >= h.First() {
		m, err := s.search(ctx, s.directGet, n, dir, h, after+1)
		if err != nil {
			return false, err
		}
		if m == nil { // a lagging replica: read from the start of the range
			m, err = s.search(ctx, s.leaderGet, n, dir, h, after+1)
			if err != nil {
				return false, err
			}
		}
		if m != nil {
			from = m.seq
		}
	}
	var reached uint64
	lagged := 0
	for reached < want {
		got := 0
		var stop bool
		var ferr error
		last, err := s.directBatch(ctx, n.stream, n.inOrder(dir), from, h.Rev, 256, maxBytes, func(m *msg) bool {
			got++
			c := m.clientSeq()
			reached = c
			if c <= after {
				return true
			}
			if stop, ferr = emitOOO(c); stop || ferr != nil {
				return false
			}
			if !fn(c, m.data) {
				stop = true
				return false
			}
			return true
		})
		if err != nil || ferr != nil || stop {
			return stop, errors.Join(err, ferr)
		}
		if got == 0 {
			// Either the replica that answered has not applied the
			// head's message yet (it will in a moment), or a prune or
			// erase since the head was read removed the rest: the
			// leader's head tells.
			nh, err := s.readHead(ctx, n, dir)
			if err != nil {
				return false, err
			}
			if !nh.Has(want) {
				return emitOOO(^uint64(0))
			}
			if lagged++; lagged > maxLagPolls {
				return false, cluster.Fail("scan "+n.inOrder(dir), errors.New("no replica has the head's envelopes"))
			}
			if err := waitBrief(ctx); err != nil {
				return false, err
			}
			continue
		}
		from = last + 1
	}
	return emitOOO(^uint64(0))
}

// sort returns the index of the first element at or above v.
func sort(a []uint64, v uint64) int {
	i, _ := slices.BinarySearch(a, v)
	return i
}
