package mailbox

import (
	"context"
	"slices"
	"sync"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/ws"
)

// watchSubprotocol is the subprotocol a watch socket is answered with.
const watchSubprotocol = "zerobyte.v1"

// watcher is one watch socket. While it replays stored envelopes, live
// ones are only noted (by sequence) and sent after the replay, so that the
// reader sees every envelope above after exactly once.
type watcher struct {
	conn *ws.Conn

	mu        sync.Mutex
	replaying bool
	missed    []uint64 // live sequences stored during the replay
	// skip holds sequences the replay already sent whose writes were
	// visible in the store but had not yet reached deliver when the
	// replay ended: deliver drops them once.
	skip map[uint64]struct{}
}

// deliver sends a newly stored envelope (mailbox mu held).
func (w *watcher) deliver(seq uint64, env []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.replaying {
		w.missed = append(w.missed, seq)
		return
	}
	if _, dup := w.skip[seq]; dup {
		delete(w.skip, seq)
		return
	}
	// A full queue closes the socket with 1013; the reader resumes with
	// after = the last sequence it holds, and nothing is lost.
	_ = w.conn.WriteBinary(env)
}

// watch is GET …/<dir>/watch?after=<seq>.
func (h *Handler) watch(ctx *fasthttp.RequestCtx, m *mailbox, r route, now int64) {
	args := ctx.QueryArgs()
	after := uint64(0)
	if args.Has("after") {
		var ok bool
		if after, ok = parseSeq(args.Peek("after"), true); !ok {
			errBadRequest.answer(ctx)
			return
		}
	}
	if err := ws.CheckHandshake(ctx); err != nil {
		refuseHandshake(ctx, err)
		return
	}
	proto := offeredSubprotocol(ctx)
	m.mu.Lock()
	d, err := m.direction(h.cfg.Store, r.dir)
	if err != nil {
		m.mu.Unlock()
		h.internal(ctx, err)
		return
	}
	if len(d.watchers)+d.pendingWatchers >= maxWatchers {
		m.mu.Unlock()
		errTooManyWatchers.answer(ctx)
		return
	}
	if !h.take(ctx, h.limits.connections, m.key, now) {
		m.mu.Unlock()
		return
	}
	d.pendingWatchers++
	m.mu.Unlock()
	opts := ws.Options{
		MaxMessage:     1024,
		MaxQueue:       h.cfg.MaxBehind,
		OverflowCode:   ws.CloseTryAgainLater,
		PingInterval:   h.cfg.PingInterval,
		SilenceTimeout: h.cfg.SilenceTimeout,
		ReadBufferSize: 512,
		Detach:         h.cfg.DetachSockets,
	}
	// The slot is the watcher's once serve runs (addWatcher), and given
	// back by abandon when fasthttp drops the connection before that.
	abandon := func() {
		m.mu.Lock()
		m.dirs[dirIndex(r.dir)].pendingWatchers--
		m.mu.Unlock()
	}
	ws.Upgrade(ctx, opts, proto, abandon, func(conn *ws.Conn) {
		w := &watcher{conn: conn, replaying: true}
		if !h.addWatcher(m, r.dir, w) {
			return
		}
		if !h.group.Add(conn) {
			h.removeWatcher(m, r.dir, w)
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		defer h.group.Remove(conn)
		defer h.removeWatcher(m, r.dir, w)
		h.m.watchers.Inc()
		defer h.m.watchers.Dec()
		go h.replay(m, r.dir, after, w)
		h.readWatch(m, r.dir, conn)
	})
}

// addWatcher turns the slot reserved before the upgrade into a watcher,
// unless the mailbox was erased meanwhile.
func (h *Handler) addWatcher(m *mailbox, dir byte, w *watcher) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := &m.dirs[dirIndex(dir)]
	d.pendingWatchers--
	if !m.exists {
		w.conn.Close(ws.CloseNormal, "mailbox erased")
		return false
	}
	d.watchers = append(d.watchers, w)
	return true
}

func (h *Handler) removeWatcher(m *mailbox, dir byte, w *watcher) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := &m.dirs[dirIndex(dir)]
	if i := slices.Index(d.watchers, w); i >= 0 {
		// slices.Delete clears the vacated slot: a closed socket left
		// there would keep its buffers reachable for as long as the
		// mailbox stays in memory.
		d.watchers = slices.Delete(d.watchers, i, i+1)
	}
}

// replay sends every stored envelope above after, paced by the socket's
// queue, then the ones stored meanwhile, then switches w to live delivery.
func (h *Handler) replay(m *mailbox, dir byte, after uint64, w *watcher) {
	pace := h.cfg.MaxBehind / 2
	ctx := context.Background()
	sent := make(map[uint64]struct{})
	err := h.cfg.Store.Scan(m.name, dir, after, func(seq uint64, env []byte) bool {
		if w.conn.WaitQueued(ctx, pace) != nil {
			return false
		}
		sent[seq] = struct{}{}
		return w.conn.WriteBinary(env) == nil
	})
	if err != nil {
		h.log.Error("watch replay", "err", err)
		w.conn.Close(ws.CloseInternalError, "")
		return
	}
	// Send what was stored during the replay, then go live. The lock
	// order (mailbox, then watcher) matches deliver's.
	for {
		m.mu.Lock()
		w.mu.Lock()
		missed := w.missed
		w.missed = nil
		if len(missed) == 0 {
			// Writes still between their sync and their deliver are
			// exactly the in-flight ones.
			for seq := range m.dirs[dirIndex(dir)].inflight {
				if _, dup := sent[seq]; dup {
					if w.skip == nil {
						w.skip = make(map[uint64]struct{})
					}
					w.skip[seq] = struct{}{}
				}
			}
			w.replaying = false
			w.mu.Unlock()
			m.mu.Unlock()
			return
		}
		w.mu.Unlock()
		m.mu.Unlock()
		for _, seq := range missed {
			if _, dup := sent[seq]; dup || seq <= after {
				continue
			}
			sent[seq] = struct{}{}
			if _, err := h.cfg.Store.Envelope(m.name, dir, seq, func(env []byte) { _ = w.conn.WriteBinary(env) }); err != nil {
				h.log.Error("watch replay", "err", err)
			}
		}
	}
}

var pong = []byte("pong")

// readWatch answers text ping with pong and marks the reader in the
// foreground; anything else closes the socket with 1003.
func (h *Handler) readWatch(m *mailbox, dir byte, conn *ws.Conn) {
	for {
		op, msg, err := conn.ReadMessage()
		if err != nil {
			return
		}
		if op != ws.OpText || string(msg) != "ping" {
			conn.Close(ws.CloseUnsupportedData, "only text ping is accepted")
			return
		}
		now := h.cfg.Now().UnixNano()
		m.mu.Lock()
		m.dirs[dirIndex(dir)].foregroundUntil = now + int64(foregroundFor)
		m.mu.Unlock()
		_ = conn.WriteText(pong)
	}
}
