package mailbox

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/ws"
	routes "edgerelay/route"
	"edgerelay/store"
)

// maxSignalFrame is the largest binary frame a signal socket forwards.
const maxSignalFrame = 64 << 10

var (
	peerUp   = []byte("peer 1")
	peerDown = []byte("peer 0")
)

// sideIndex is the router's side number: 0 primary, 1 companion.
func sideIndex(side byte) int {
	if side == 'p' {
		return 0
	}
	return 1
}

// signal is GET …/signal/<primary|companion>.
func (h *Handler) signal(ctx *fasthttp.RequestCtx, m store.Mailbox, r route, key uint64, tok store.Hash, now int64) {
	if err := ws.CheckHandshake(ctx); err != nil {
		refuseHandshake(ctx, err)
		return
	}
	if !h.take(ctx, h.limits.connections, key, now) {
		return
	}
	me := sideIndex(r.side)
	frameKey := dirKey(key, r.side)
	name := m.Name()
	// Nothing is reserved for a signal side before its upgrade (the newer
	// socket replaces the older one in serve).
	ws.Upgrade(ctx, h.signalWS, offeredSubprotocol(ctx), nil, func(conn *ws.Conn) {
		if !h.group.Add(conn) {
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		sock := &signalSocket{h: h, conn: conn, frameKey: frameKey}
		side, err := h.cfg.Signals.Join(context.Background(), name, me, sock)
		if err != nil {
			h.group.Remove(conn)
			h.log.Error("signal join failed", "err", err)
			conn.Close(ws.CloseTryAgainLater, "signal rendezvous unavailable")
			return
		}
		// An erase between the request's Open and the join found no
		// socket to close: ask again now that this one is joined.
		if !h.stillThere(name, tok) {
			side.Leave()
			h.group.Remove(conn)
			conn.Close(ws.CloseNormal, "mailbox erased")
			return
		}
		h.m.signalSockets.Inc()
		sock.side = side // before Serve: its callbacks run after
		conn.Serve(sock.frame, sock.end)
	})
}

// signalSocket is one signal socket: the router's end of it (every call
// of which only queues onto the socket) and its reading. It is all an
// idle signal socket keeps of the handler: its methods are the router's
// and the socket's callbacks, no closures.
type signalSocket struct {
	h        *Handler
	conn     *ws.Conn
	side     routes.SignalSide // set once joined
	frameKey uint64            // the frame bucket's key of this side
}

// Frame queues msg; a full queue closes the socket with 1013.
func (s *signalSocket) Frame(msg []byte) {
	if errors.Is(s.conn.WriteBinary(msg), ws.ErrQueueFull) {
		s.h.m.slowSignal.Inc()
	}
}
func (s *signalSocket) Peer(up bool) {
	if up {
		_ = s.conn.WriteText(peerUp)
	} else {
		_ = s.conn.WriteText(peerDown)
	}
}
func (s *signalSocket) Replaced()  { s.conn.Close(ws.CloseReplaced, "replaced") }
func (s *signalSocket) Erased()    { s.conn.Close(ws.CloseNormal, "mailbox erased") }
func (s *signalSocket) GoingAway() { s.conn.Close(ws.CloseGoingAway, "relay going away") }

func (s *signalSocket) frame(op int, msg []byte) bool {
	return s.h.signalFrame(s.side, s.conn, s.frameKey, op, msg)
}

func (s *signalSocket) end(error) {
	s.h.m.signalSockets.Dec()
	s.side.Leave()
	s.h.group.Remove(s.conn)
}

// stillThere reports whether the mailbox name is still live for tok.
func (h *Handler) stillThere(name string, tok store.Hash) bool {
	m, err := h.cfg.Store.Open(context.Background(), []byte(name), tok, h.cfg.Now().UnixNano())
	if err != nil {
		return !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrForbidden)
	}
	m.Release()
	return true
}

// signalFrame forwards a binary frame to the other side; false ends the
// socket's reading. Frames are never stored and never read.
func (h *Handler) signalFrame(side routes.SignalSide, conn *ws.Conn, frameKey uint64, op int, msg []byte) bool {
	switch {
	case op == ws.OpBinary:
		if ok, _ := h.limits.signalFrames.Take(frameKey, h.cfg.Now().UnixNano()); !ok {
			conn.Close(ws.ClosePolicyViolation, "signal frames too fast")
			return false
		}
		side.Send(msg)
		h.m.signalFrames.Inc()
	case string(msg) == "ping":
		_ = conn.WriteText(pong)
	default:
		conn.Close(ws.CloseUnsupportedData, "only binary frames and text ping are accepted")
		return false
	}
	return true
}

// refuseHandshake answers a handshake ws.CheckHandshake refused: 426
// upgrade_required (with Sec-WebSocket-Version: 13) for a WebSocket version
// other than 13, 400 bad_request otherwise.
func refuseHandshake(ctx *fasthttp.RequestCtx, err error) {
	if ws.Refusal(ctx, err) == fasthttp.StatusUpgradeRequired {
		errUpgradeRequired.answer(ctx)
		return
	}
	errBadRequest.answer(ctx)
}

// offeredSubprotocol answers zerobyte.v1 when the client offered it, and
// never the bearer subprotocol.
func offeredSubprotocol(ctx *fasthttp.RequestCtx) string {
	offered := false
	ws.Subprotocols(ctx, func(p []byte) bool {
		offered = string(p) == watchSubprotocol
		return !offered
	})
	if offered {
		return watchSubprotocol
	}
	return ""
}
