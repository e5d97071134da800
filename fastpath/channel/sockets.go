package channel

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel/control"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ws"
	"edgerelay/route"
)

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
	hc, err := h.route.Host(ctx, k.Hash)
	switch {
	case errors.Is(err, route.ErrChannelHeld):
		h.m.refused.WithLabelValues("control_open").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "control socket already open")
		return
	case err != nil:
		h.storeFailed(ctx, "control socket", err)
		return
	}

	// The reservation is the control socket's once serve runs, which
	// ends it; abandon ends it when fasthttp drops the connection before
	// that, so that the computer's next socket is not refused for one
	// never opened. Ending it closes the computer's phones with 1001.
	ws.Upgrade(ctx, h.wsOptions(maxControlFrame), "", hc.End, func(conn *ws.Conn) {
		defer hc.End()
		if !h.group.Add(conn) {
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		defer h.group.Remove(conn)
		if !hc.Attach(conn) { // released while the upgrade was in flight
			conn.Close(ws.CloseNormal, "")
			return
		}
		h.m.computers.Inc()
		defer h.m.computers.Dec()
		h.log.Info("control socket open", "host", k.Host)
		h.readControl(k.Host, hc, conn)
		h.log.Info("control socket closed", "host", k.Host, "code", conn.CloseCode())
	})
}

// readControl reads the computer's control frames until the socket ends.
// A malformed frame closes the socket with 1008.
func (h *Handler) readControl(host string, hc route.ChannelHost, conn *ws.Conn) {
	scratch := make([]byte, 0, 1024)
	// msg's id goes to the router by pointer, through an interface, so
	// it lives on the heap: once per socket, not once per frame.
	var msg control.Message
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
		msg, scratch, err = control.Parse(frame, scratch)
		if err != nil {
			h.m.malformed.Inc()
			h.log.Info("malformed control frame", "host", host, "err", err)
			conn.Close(ws.ClosePolicyViolation, "malformed control frame")
			return
		}
		// An id that is gone (the phone just left) or another computer's
		// reaches nobody.
		if msg.Type == control.TypeClose {
			hc.ClosePhone(&msg.ID)
		} else if hc.ToPhone(&msg.ID, msg.Data) {
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
	id, err := newID()
	if err != nil {
		h.log.Error("channel id", "err", err)
		httpx.Error(ctx, fasthttp.StatusInternalServerError, "internal error")
		return
	}
	hp, err := h.route.Phone(ctx, k.Hash, id)
	switch {
	case errors.Is(err, route.ErrChannelOffline):
		h.m.refused.WithLabelValues("computer_offline").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "computer not connected")
		return
	case errors.Is(err, route.ErrChannelFull):
		h.m.refused.WithLabelValues("too_many_phones").Inc()
		httpx.Error(ctx, fasthttp.StatusForbidden, "too many phone channels")
		return
	case err != nil:
		h.storeFailed(ctx, "phone admission", err)
		return
	}
	// serve turns the reservation into a phone channel; abandon (End
	// before Attach) gives it back when fasthttp drops the connection
	// before serve runs.
	ws.Upgrade(ctx, h.wsOptions(MaxFrame), "", hp.End, func(conn *ws.Conn) {
		defer hp.End()
		if !h.group.Add(conn) {
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		defer h.group.Remove(conn)
		actx, cancel := context.WithTimeout(context.Background(), routeTimeout)
		attached := hp.Attach(actx, conn)
		cancel()
		if !attached {
			conn.Close(ws.CloseGoingAway, "computer offline")
			return
		}
		h.m.phones.Inc()
		defer h.m.phones.Dec()
		h.readPhone(hp, conn)
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

// readPhone forwards the phone's frames to its computer, each wrapped in a
// data control message, until the phone leaves or is closed.
func (h *Handler) readPhone(hp route.ChannelPhone, conn *ws.Conn) {
	for {
		op, frame, err := conn.ReadMessage()
		if err != nil {
			return // 1009 for an oversized frame is sent by the reader
		}
		if op != ws.OpText {
			conn.Close(ws.CloseUnsupportedData, "binary frames are not accepted")
			return
		}
		if err := hp.ToHost(frame); err != nil {
			return // the control socket is gone or being dropped
		}
		h.m.toComputer.Inc()
	}
}
