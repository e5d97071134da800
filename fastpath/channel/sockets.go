package channel

import (
	"sync"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel/control"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ws"
	"edgerelay/store"
)

// computer is one claimed computer whose control socket is open or being
// opened. Its entry in Handler.computers is the reservation that makes a
// second control socket fail with 403.
type computer struct {
	key  store.Hash
	host string

	// ready is closed once ctl is set or the computer is gone. The 101
	// reaches the computer before the relay's side of the socket exists,
	// so a phone admitted in that instant waits for ready instead of
	// being refused.
	ready     chan struct{}
	readyOnce sync.Once

	mu       sync.Mutex
	ctl      *ws.Conn // nil until the upgrade has completed
	phones   map[control.ID]*phone
	reserved int  // phone upgrades admitted but not yet registered
	gone     bool // the control socket has ended
}

// phone is one phone channel.
type phone struct {
	id   control.ID
	conn *ws.Conn
	// closedByComputer is set when the computer's own close message ended
	// the channel: then the computer is not told about it.
	closedByComputer bool
}

func (c *computer) markReady() { c.readyOnce.Do(func() { close(c.ready) }) }

func (c *computer) open() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctl != nil && !c.gone
}

// shutdown closes the control socket (or marks a pending one gone).
func (c *computer) shutdown(code int) {
	c.mu.Lock()
	ctl := c.ctl
	c.gone = true
	c.mu.Unlock()
	c.markReady()
	if ctl != nil {
		ctl.Close(code, "")
	}
}

func (h *Handler) wsOptions(maxMessage int) ws.Options {
	return ws.Options{
		MaxMessage:   maxMessage,
		MaxQueue:     h.cfg.MaxQueue,
		OverflowCode: ws.ClosePolicyViolation,
		PingInterval: h.cfg.PingInterval,
		Detach:       h.cfg.DetachSockets,
	}
}

// openControl upgrades GET /host into the computer's control socket.
func (h *Handler) openControl(ctx *fasthttp.RequestCtx) {
	k, ok := h.authenticate(ctx, httpx.Bearer(ctx), h.cfg.Claims.ByOwner, fasthttp.StatusForbidden)
	if !ok {
		return
	}
	if err := ws.CheckHandshake(ctx); err != nil {
		refuseHandshake(ctx, err)
		return
	}
	comp := &computer{key: k.Hash, host: k.Host, phones: make(map[control.ID]*phone), ready: make(chan struct{})}
	h.mu.Lock()
	if h.computers[k.Hash] != nil {
		h.mu.Unlock()
		h.m.refused.WithLabelValues("control_open").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "control socket already open")
		return
	}
	h.computers[k.Hash] = comp
	h.mu.Unlock()

	// The claim is the control socket's once serve runs, which ends it;
	// abandon ends it when fasthttp drops the connection before that, so
	// that the computer's next socket is not refused for one never opened.
	abandon := func() { h.endControl(comp) }
	ws.Upgrade(ctx, h.wsOptions(maxControlFrame), "", abandon, func(conn *ws.Conn) {
		defer h.endControl(comp)
		defer comp.markReady()
		if !h.group.Add(conn) {
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		defer h.group.Remove(conn)
		comp.mu.Lock()
		if comp.gone { // released while the upgrade was in flight
			comp.mu.Unlock()
			conn.Close(ws.CloseNormal, "")
			return
		}
		comp.ctl = conn
		comp.mu.Unlock()
		comp.markReady()
		h.m.computers.Inc()
		defer h.m.computers.Dec()
		h.log.Info("control socket open", "host", comp.host)
		h.readControl(comp, conn)
		h.log.Info("control socket closed", "host", comp.host, "code", conn.CloseCode())
	})
}

// endControl forgets the computer and closes every phone it had with 1001.
func (h *Handler) endControl(comp *computer) {
	h.mu.Lock()
	if h.computers[comp.key] == comp {
		delete(h.computers, comp.key)
	}
	h.mu.Unlock()
	comp.mu.Lock()
	comp.gone = true
	comp.markReady()
	phones := make([]*phone, 0, len(comp.phones))
	for _, p := range comp.phones {
		phones = append(phones, p)
	}
	comp.mu.Unlock()
	for _, p := range phones {
		p.conn.Close(ws.CloseGoingAway, "computer offline")
	}
}

// readControl reads the computer's control frames until the socket ends.
// A malformed frame closes the socket with 1008.
func (h *Handler) readControl(comp *computer, conn *ws.Conn) {
	scratch := make([]byte, 0, 1024)
	for {
		op, frame, err := conn.ReadMessage()
		if err != nil {
			return
		}
		if op != ws.OpText {
			h.m.malformed.Inc()
			conn.Close(ws.ClosePolicyViolation, "binary control frame")
			return
		}
		var msg control.Message
		msg, scratch, err = control.Parse(frame, scratch)
		if err != nil {
			h.m.malformed.Inc()
			h.log.Info("malformed control frame", "host", comp.host, "err", err)
			conn.Close(ws.ClosePolicyViolation, "malformed control frame")
			return
		}
		comp.mu.Lock()
		p := comp.phones[msg.ID]
		if p != nil && msg.Type == control.TypeClose {
			p.closedByComputer = true
			delete(comp.phones, msg.ID)
		}
		comp.mu.Unlock()
		if p == nil {
			continue // the phone just left, or the id is not this computer's
		}
		if msg.Type == control.TypeClose {
			p.conn.Close(ws.CloseNormal, "")
			continue
		}
		// A full queue drops that phone alone; its reader then tells the
		// computer, and every other phone keeps flowing.
		if err := p.conn.WriteText(msg.Data); err == nil {
			h.m.toPhone.Inc()
		}
		// Frames above the pooled size should not pin memory.
		if cap(scratch) > 4*MaxFrame {
			scratch = make([]byte, 0, 1024)
		}
	}
}

// openPhone upgrades GET /botharness-device/channel into a phone channel.
func (h *Handler) openPhone(ctx *fasthttp.RequestCtx) {
	tok := httpx.Bearer(ctx)
	if tok == nil {
		tok = ctx.Request.Header.Peek("X-BotHarness-Admission")
	}
	k, ok := h.authenticate(ctx, tok, h.cfg.Claims.ByPhone, fasthttp.StatusForbidden)
	if !ok {
		return
	}
	if err := ws.CheckHandshake(ctx); err != nil {
		refuseHandshake(ctx, err)
		return
	}
	h.mu.Lock()
	comp := h.computers[k.Hash]
	h.mu.Unlock()
	if comp == nil {
		h.m.refused.WithLabelValues("computer_offline").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "computer not connected")
		return
	}
	comp.mu.Lock()
	switch {
	case comp.gone:
		comp.mu.Unlock()
		h.m.refused.WithLabelValues("computer_offline").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "computer not connected")
		return
	case len(comp.phones)+comp.reserved >= MaxPhones:
		comp.mu.Unlock()
		h.m.refused.WithLabelValues("too_many_phones").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "too many phone channels")
		return
	}
	comp.reserved++
	comp.mu.Unlock()

	id, err := newID()
	if err != nil {
		comp.mu.Lock()
		comp.reserved--
		comp.mu.Unlock()
		h.log.Error("channel id", "err", err)
		httpx.Error(ctx, fasthttp.StatusInternalServerError, "internal error")
		return
	}
	// serve turns the reservation into a phone channel; abandon gives it
	// back when fasthttp drops the connection before serve runs.
	abandon := func() {
		comp.mu.Lock()
		comp.reserved--
		comp.mu.Unlock()
	}
	ws.Upgrade(ctx, h.wsOptions(MaxFrame), "", abandon, func(conn *ws.Conn) {
		p := &phone{id: id, conn: conn}
		<-comp.ready
		comp.mu.Lock()
		comp.reserved--
		ctl := comp.ctl
		if comp.gone || ctl == nil {
			comp.mu.Unlock()
			conn.Close(ws.CloseGoingAway, "computer offline")
			return
		}
		comp.phones[id] = p
		comp.mu.Unlock()
		if !h.group.Add(conn) {
			h.forgetPhone(comp, p)
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		defer h.group.Remove(conn)
		h.m.phones.Inc()
		defer h.m.phones.Dec()

		var buf [16 + control.IDLen + 2]byte
		_ = ctl.WriteText(control.AppendOpen(buf[:0], &id))
		h.readPhone(ctl, p)
		if h.forgetPhone(comp, p) {
			_ = ctl.WriteText(control.AppendClose(buf[:0], &id))
		}
	})
}

// refuseHandshake answers a handshake ws.CheckHandshake refused: 426 with
// Sec-WebSocket-Version: 13 for a WebSocket version other than 13, 400
// otherwise.
func refuseHandshake(ctx *fasthttp.RequestCtx, err error) {
	status := ws.Refusal(ctx, err)
	if status == fasthttp.StatusUpgradeRequired {
		httpx.Error(ctx, status, "unsupported websocket version")
		return
	}
	httpx.Error(ctx, status, "not a websocket handshake")
}

// forgetPhone removes p from its computer and reports whether the computer
// should be told (the channel did not end by the computer's own close).
func (h *Handler) forgetPhone(comp *computer, p *phone) bool {
	comp.mu.Lock()
	defer comp.mu.Unlock()
	if comp.phones[p.id] == p {
		delete(comp.phones, p.id)
	}
	return !p.closedByComputer && !comp.gone
}

// readPhone forwards the phone's frames to its computer, each wrapped in a
// data control message, until the phone leaves or is closed.
func (h *Handler) readPhone(ctl *ws.Conn, p *phone) {
	for {
		op, frame, err := p.conn.ReadMessage()
		if err != nil {
			return // 1009 for an oversized frame is sent by the reader
		}
		if op != ws.OpText {
			p.conn.Close(ws.CloseUnsupportedData, "binary frames are not accepted")
			return
		}
		bp := h.scratch.Get().(*[]byte)
		*bp = control.AppendData((*bp)[:0], &p.id, frame)
		err = ctl.WriteText(*bp)
		// Even a frame at the limit, escaped, fits a pooled buffer, so
		// forwarding stays allocation-free up to 70,000 bytes; the pool
		// itself lets idle buffers go at GC.
		if cap(*bp) <= maxControlFrame {
			h.scratch.Put(bp)
		}
		if err != nil {
			return // the control socket is gone or being dropped
		}
		h.m.toComputer.Inc()
	}
}
