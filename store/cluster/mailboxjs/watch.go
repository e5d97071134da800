package mailboxjs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/store/cluster"
)

// Why a watch ended (passed to WatchConfig.End).
var (
	// ErrErased: the mailbox was erased (close the socket with 1000).
	ErrErased = errors.New("mailboxjs: mailbox erased")
	// ErrOverflow: the watcher fell more than QueueBytes behind (close
	// with 1013; the reader resumes with after = the last it holds).
	ErrOverflow = errors.New("mailboxjs: watcher fell behind")
)

// WatchConfig is one watcher.
type WatchConfig struct {
	// After: deliver every stored envelope above it, then each new one.
	After uint64
	// Deliver is called for each envelope once, in order, from the
	// watch's own goroutine (never NATS's): a slow Deliver only fills
	// this watch's queue.
	Deliver func(seq uint64, env []byte)
	// End is called once when the watch ends: nil after Close, ErrErased,
	// ErrOverflow, or a store error (wrapping store.ErrUnavailable).
	End func(error)
	// QueueBytes bounds what waits for Deliver (default 1 MiB).
	QueueBytes int

	// drop, in tests, loses the republished messages it returns true for,
	// as a reconnect or a slow consumer would.
	drop func(*nats.Msg) bool
}

// errDeliverStopped: a read-back's handler stopped it.
var errDeliverStopped = errors.New("mailboxjs: delivery stopped the watch")

// Watch delivers a direction's envelopes: stored ones above After, then
// new ones as they are stored, each exactly once, through any node.
//
// It subscribes to the RePublish subject first, then reads the head
// through the leader and backfills from the stream up to that head; a
// republished message at or below the last one handled is dropped. Every
// message of a direction names the one before it (its compare-and-set
// header, Nats-Expected-Last-Subject-Sequence, exact because
// each write compared-and-set on it), so a lost notification (a reconnect,
// a slow consumer) shows as a gap at the next one and is read back from
// the stream before it.
type Watch struct {
	s      *Store
	n      names
	dir    byte
	cfg    WatchConfig
	subs   []*nats.Subscription
	queue  chan *nats.Msg
	bytes  atomic.Int64
	full   atomic.Bool
	ctx    context.Context // ended by Close (and cfg.bound)
	cancel context.CancelFunc
	// readBacks counts the gaps read back from the stream (a test
	// checks that a watcher that lost nothing reads nothing back).
	readBacks atomic.Int64
	done      chan struct{}
}

const watchQueueLen = 4096

// Watch starts a watcher; it ends with cfg.End.
func (s *Store) Watch(ctx context.Context, name string, dir byte, cfg WatchConfig) (*Watch, error) {
	n, err := s.names(name)
	if err != nil {
		return nil, err
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = 1 << 20
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	w := &Watch{s: s, n: n, dir: dir, cfg: cfg, queue: make(chan *nats.Msg, watchQueueLen), done: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	for _, subj := range []string{n.watch(dir), n.control()} {
		sub, err := s.nc.Subscribe(subj, w.enqueue)
		if err != nil {
			w.cancel()
			w.unsubscribe()
			return nil, cluster.Fail("watch "+subj, err)
		}
		w.subs = append(w.subs, sub)
	}
	// The subscriptions reach the server before the head is read, so a
	// message stored after that read is republished to this watch; one
	// lost anyway shows as a gap at the next message.
	if err := s.nc.FlushWithContext(ctx); err != nil {
		w.cancel()
		w.unsubscribe()
		return nil, cluster.Fail("watch "+name, err)
	}
	h, err := s.readHead(ctx, n, dir)
	if err != nil {
		w.cancel()
		w.unsubscribe()
		return nil, err
	}
	go w.run(h)
	return w, nil
}

// enqueue runs on the subscription's NATS goroutine: it never blocks.
func (w *Watch) enqueue(m *nats.Msg) {
	if w.full.Load() || (w.cfg.drop != nil && w.cfg.drop(m)) {
		return
	}
	size := int64(len(m.Data) + 64)
	if w.bytes.Add(size) > int64(w.cfg.QueueBytes) {
		w.full.Store(true)
		w.wake()
		return
	}
	select {
	case w.queue <- m:
	default:
		w.full.Store(true)
		w.wake()
	}
}

func (w *Watch) wake() {
	select {
	case w.queue <- nil:
	default:
	}
}

// Close ends the watch (End gets nil) and waits for its goroutine.
func (w *Watch) Close() {
	w.cancel()
	<-w.done
}

func (w *Watch) unsubscribe() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
}

func (w *Watch) run(h Head) {
	ctx := w.ctx
	defer w.cancel()
	err := w.loop(ctx, h)
	w.unsubscribe()
	if err != nil && ctx.Err() != nil {
		err = nil // closed
	}
	if w.cfg.End != nil {
		w.cfg.End(err) // before done: Close returns only after End (End must not call Close)
	}
	close(w.done)
}

func (w *Watch) loop(ctx context.Context, h Head) error {
	// Backfill: every stored envelope above After as of the head read.
	stopped := false
	if _, err := w.s.scan(ctx, w.n, w.dir, &h, w.cfg.After, 0, func(seq uint64, env []byte) bool {
		if !w.emit(seq, env, true) {
			stopped = true
			return false
		}
		return ctx.Err() == nil
	}); err != nil {
		return err
	}
	if stopped {
		return errDeliverStopped
	}
	last := h.Rev // the last message of the direction handled
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m = <-w.queue:
		}
		if w.full.Load() {
			return ErrOverflow
		}
		if m == nil {
			continue
		}
		w.bytes.Add(-int64(len(m.Data) + 64))
		if m.Subject == w.n.control() {
			if string(m.Data) == ctlErased {
				return ErrErased
			}
			continue
		}
		seq, _ := strconv.ParseUint(m.Header.Get(hdrStreamSq), 10, 64)
		if seq <= last {
			continue // backfilled already
		}
		prev, _ := strconv.ParseUint(m.Header.Get(hdrExpSeq), 10, 64)
		if prev != last {
			// A gap: read what was missed from the stream, in order,
			// then this message is a duplicate or next in line.
			w.readBacks.Add(1)
			var err error
			if last, err = w.catchUp(ctx, last, seq); err != nil {
				return err
			}
			if seq <= last {
				continue
			}
		}
		last = seq
		if !w.handle(m.Subject, m.Data) {
			return errDeliverStopped
		}
	}
}

// emit delivers one envelope; false: the watch is to end.
func (w *Watch) emit(seq uint64, env []byte, replayed bool) bool {
	w.cfg.Deliver(seq, env)
	return true
}

// handle delivers a direction message if it is an envelope above After
// (a prune mark only advances the chain); false: the watch is to end.
func (w *Watch) handle(subject string, data []byte) bool {
	if strings.HasSuffix(subject, ".m") {
		return true
	}
	if c := envelopeSeq(data); c > w.cfg.After {
		return w.emit(c, data, false)
	}
	return true
}

// catchUp reads the direction's messages after stream sequence last up to
// and including upTo from the stream, in stream order, delivering them,
// and returns the last one read. A lagging replica is asked again.
func (w *Watch) catchUp(ctx context.Context, last, upTo uint64) (uint64, error) {
	return w.s.readBack(ctx, w.n, w.dir, last, upTo, w.handle)
}

// readBack reads a direction's messages after stream sequence last up to
// and including upTo from the stream, in stream order, passing each to
// handle (false: stop, errDeliverStopped), and returns the last one read.
// The leader first says where the direction's messages resume: a replica
// may not have applied a purge (a prune, an erase) yet and would hand back
// envelopes the reader has pruned. A replica that lags is asked again.
// (Read-backs are rare, gaps only: the leader's round trip is not on the
// path of a watch that lost nothing.)
func (s *Store) readBack(ctx context.Context, n names, dir byte, last, upTo uint64, handle func(subject string, data []byte) bool) (uint64, error) {
	for lagged := 0; last < upTo; {
		next, err := s.leaderGet(ctx, n.stream, getReq{Seq: last + 1, NextFor: n.dirAll(dir)})
		if errors.Is(err, errNoMsg) || (err == nil && next.seq > upTo) {
			return upTo, nil // nothing left up to upTo: the reader pruned it
		}
		if err != nil {
			return last, err
		}
		got := 0
		stopped := false
		_, err = s.directBatch(ctx, n.stream, n.dirAll(dir), next.seq, upTo, 256, scanBatchBytes, func(m *msg) bool {
			got++
			last = m.seq
			stopped = !handle(m.subject, m.data)
			return !stopped
		})
		if err != nil {
			return last, err
		}
		if stopped {
			return last, errDeliverStopped
		}
		if got == 0 {
			// The leader has a message the replica has not.
			if lagged++; lagged > maxLagPolls {
				return last, cluster.Fail("watch "+n.dirAll(dir), errors.New("no replica has the missed messages"))
			}
			if err := waitBrief(ctx); err != nil {
				return last, err
			}
		}
	}
	return last, nil
}

func waitBrief(ctx context.Context) error {
	t := time.NewTimer(2 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return cluster.Fail("watch", ctx.Err())
	case <-t.C:
		return nil
	}
}
