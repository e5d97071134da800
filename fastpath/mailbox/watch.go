package mailbox

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/ws"
	"edgerelay/store"
)

// watchSubprotocol is the subprotocol a watch socket is answered with.
const watchSubprotocol = "zerobyte.v1"

// watch is GET …/<dir>/watch?after=<seq>. The store delivers (the stored
// envelopes above after, then each new one, each once, written through
// any node); the socket's queue bounds how far the reader may fall behind.
func (h *Handler) watch(ctx *fasthttp.RequestCtx, m store.Mailbox, r route, key uint64, now int64) {
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
	// The place is taken before the upgrade, so that a 9th socket is
	// refused with 429 rather than closed after it.
	leave, err := m.JoinWatchers(context.Background(), r.dir)
	switch {
	case errors.Is(err, store.ErrTooManyWatchers):
		errTooManyWatchers.answer(ctx)
		return
	case err != nil:
		h.internal(ctx, err)
		return
	}
	if !h.take(ctx, h.limits.connections, key, now) {
		leave()
		return
	}
	// The place is the socket's until it ends, and given back by abandon
	// when fasthttp drops the connection before serve runs. The request's
	// hold on m ends with the request, so the socket reopens the handle
	// it keeps: the place holds the mailbox meanwhile.
	ws.Upgrade(ctx, h.watchWS, proto, leave, func(conn *ws.Conn) {
		if !h.group.Add(conn) {
			leave()
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		h.m.watchers.Inc()
		w := &watchSocket{h: h, conn: conn, m: m, leave: leave, dir: r.dir}
		w.serve(after)
	})
}

// A watchSocket is one watch: the store's watch beside the socket's
// reading. It is all an idle watch keeps of the handler: its methods are
// the watch's and the socket's callbacks, no closures.
type watchSocket struct {
	h     *Handler
	conn  *ws.Conn
	m     store.Mailbox
	leave func() // gives the watcher's place back
	stop  func() // ends the store's watch
	dir   byte
}

// serve runs the store's watch beside the socket's reading: the watch
// ending closes the socket with its code, the socket ending stops the
// watch and then gives the place back.
func (w *watchSocket) serve(after uint64) {
	stop, err := w.m.Watch(context.Background(), w.dir, store.WatchConfig{
		After:   after,
		Deliver: w.deliver,
		End:     w.endWatch,
	})
	if err != nil {
		w.endWatch(err)
		w.done()
		return
	}
	w.stop = stop
	w.conn.Serve(w.frame, w.end)
}

// deliver queues one envelope. A full queue closes the socket with 1013;
// the reader resumes with after = the last sequence it holds, and nothing
// is lost.
func (w *watchSocket) deliver(ctx context.Context, env []byte, replayed bool) error {
	if replayed { // paced by the socket's queue
		if err := w.conn.WaitQueued(ctx, w.h.cfg.MaxBehind/2); err != nil {
			return err
		}
	}
	err := w.conn.WriteBinary(env)
	if errors.Is(err, ws.ErrQueueFull) {
		w.h.m.slowWatch.Inc()
	}
	return err
}

func (w *watchSocket) endWatch(err error) { w.h.endWatch(w.conn, err) }

func (w *watchSocket) frame(op int, msg []byte) bool {
	return w.h.watchFrame(w.m, w.dir, w.conn, op, msg)
}

// end is the socket's end: the store's watch stops, then the place goes.
func (w *watchSocket) end(error) {
	w.stop()
	w.done()
}

func (w *watchSocket) done() {
	w.h.m.watchers.Dec()
	w.h.group.Remove(w.conn)
	w.leave()
}

// endWatch closes a watch socket with the code for why its watch ended.
func (h *Handler) endWatch(conn *ws.Conn, err error) {
	switch {
	case errors.Is(err, store.ErrErased):
		conn.Close(ws.CloseNormal, "mailbox erased")
	case errors.Is(err, store.ErrWatchOverflow):
		h.m.slowWatch.Inc()
		conn.Close(ws.CloseTryAgainLater, "fell behind")
	case errors.Is(err, store.ErrUnavailable):
		conn.Close(ws.CloseTryAgainLater, "store unavailable")
	case errors.Is(err, ws.ErrClosed), errors.Is(err, ws.ErrQueueFull): // the socket ended first
	default:
		h.log.Error("watch failed", "err", err)
		conn.Close(ws.CloseInternalError, "")
	}
}

var pong = []byte("pong")

// watchFrame answers text ping with pong and marks the reader in the
// foreground; anything else closes the socket with 1003. It never blocks
// (ws.Options.InlineMessages): keep it so.
func (h *Handler) watchFrame(m store.Mailbox, dir byte, conn *ws.Conn, op int, msg []byte) bool {
	if op != ws.OpText || string(msg) != "ping" {
		conn.Close(ws.CloseUnsupportedData, "only text ping is accepted")
		return false
	}
	m.SetForeground(dir, h.cfg.Now().UnixNano()+int64(foregroundFor))
	_ = conn.WriteText(pong)
	return true
}
