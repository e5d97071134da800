package mailbox

import (
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/ws"
)

// maxSignalFrame is the largest binary frame a signal socket forwards.
const maxSignalFrame = 64 << 10

var (
	peerUp   = []byte("peer 1")
	peerDown = []byte("peer 0")
)

// signalSides holds the two sockets of a mailbox's signal rendezvous:
// [0] primary, [1] companion. Frames look the other side up on every
// forward, so the pointers are atomic rather than under the mailbox lock.
type signalSides [2]atomic.Pointer[ws.Conn]

func sideIndex(side byte) int {
	if side == 'p' {
		return 0
	}
	return 1
}

// signal is GET …/signal/<primary|companion>.
func (h *Handler) signal(ctx *fasthttp.RequestCtx, m *mailbox, r route, now int64) {
	if err := ws.CheckHandshake(ctx); err != nil {
		refuseHandshake(ctx, err)
		return
	}
	if !h.take(ctx, h.limits.connections, m.key, now) {
		return
	}
	opts := ws.Options{
		MaxMessage:     maxSignalFrame,
		MaxQueue:       h.cfg.MaxBehind,
		OverflowCode:   ws.CloseTryAgainLater,
		PingInterval:   h.cfg.PingInterval,
		SilenceTimeout: h.cfg.SilenceTimeout,
		ReadBufferSize: 4096,
		Detach:         h.cfg.DetachSockets,
	}
	me, other := sideIndex(r.side), 1-sideIndex(r.side)
	frameKey := dirKey(m.key, r.side)
	// Nothing is reserved for a signal side before its upgrade (the newer
	// socket replaces the older one in serve). The mailbox is held from
	// here until the socket ends, so that it cannot be evicted from
	// memory before serve registers the socket; abandon lets it go.
	m.refs.Add(1) // the request holds it too: no eviction races this
	release := func() { h.cache.release(m) }
	ws.Upgrade(ctx, opts, offeredSubprotocol(ctx), release, func(conn *ws.Conn) {
		defer release()
		if !h.group.Add(conn) {
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		defer h.group.Remove(conn)
		m.mu.Lock()
		if !m.exists { // erased while upgrading
			m.mu.Unlock()
			conn.Close(ws.CloseNormal, "mailbox erased")
			return
		}
		old := m.signal[me].Swap(conn)
		peer := m.signal[other].Load()
		m.mu.Unlock()
		if old != nil {
			old.Close(ws.CloseReplaced, "replaced")
		}
		if peer != nil {
			_ = peer.WriteText(peerUp)
			_ = conn.WriteText(peerUp)
		}
		h.m.signalSockets.Inc()
		defer h.m.signalSockets.Dec()
		h.readSignal(m, conn, other, frameKey)
		m.mu.Lock()
		still := m.signal[me].CompareAndSwap(conn, nil)
		peer = m.signal[other].Load()
		m.mu.Unlock()
		if still && peer != nil {
			_ = peer.WriteText(peerDown)
		}
	})
}

// readSignal forwards binary frames to the other side until the socket
// ends. Frames are never stored and never read.
func (h *Handler) readSignal(m *mailbox, conn *ws.Conn, other int, frameKey uint64) {
	for {
		op, msg, err := conn.ReadMessage()
		if err != nil {
			return
		}
		switch {
		case op == ws.OpBinary:
			if ok, _ := h.limits.signalFrames.Take(frameKey, h.cfg.Now().UnixNano()); !ok {
				conn.Close(ws.ClosePolicyViolation, "signal frames too fast")
				return
			}
			if peer := m.signal[other].Load(); peer != nil {
				_ = peer.WriteBinary(msg) // a full queue closes that peer with 1013
				h.m.signalFrames.Inc()
			}
		case string(msg) == "ping":
			_ = conn.WriteText(pong)
		default:
			conn.Close(ws.CloseUnsupportedData, "only binary frames and text ping are accepted")
			return
		}
	}
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
