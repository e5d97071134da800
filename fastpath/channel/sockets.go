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

func (h *Handler) wsSettings(maxMessage int) *ws.Settings {
	return ws.NewSettings(ws.Options{
		MaxMessage:   maxMessage,
		MaxQueue:     h.cfg.MaxQueue,
		OverflowCode: ws.ClosePolicyViolation,
		PingInterval: h.cfg.PingInterval,
		Detach:       h.cfg.DetachSockets,
		Parker:       h.cfg.Parker,
	})
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
	// Only the host name is kept for the socket's life, not the whole key.
	host := k.Host
	ws.Upgrade(ctx, h.control, "", hc.End, func(conn *ws.Conn) {
		if !h.group.Add(conn) {
			hc.End()
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		if !hc.Attach(conn) { // released while the upgrade was in flight
			h.group.Remove(conn)
			hc.End()
			conn.Close(ws.CloseNormal, "")
			return
		}
		h.m.computers.Inc()
		h.log.Info("control socket open", "host", host)
		r := &controlReader{h: h, host: host, hc: hc, conn: conn}
		conn.Serve(r.frame, r.end)
	})
}

// A controlReader takes the computer's control frames. A malformed frame
// closes the socket with 1008. It is all an idle control socket keeps of
// the handler: its methods are the socket's callbacks, no closures.
type controlReader struct {
	h    *Handler
	host string
	hc   route.ChannelHost
	conn *ws.Conn
	// p is the parser's state, made at the first frame: a control socket
	// that has sent none (most of them, most of the time) keeps none.
	p *controlParse
}

// controlParse is a control socket's parser state. msg's id goes to the
// router by pointer, through an interface: a field, so once per socket,
// not per frame. scratch is grown on the first data frame with escapes.
type controlParse struct {
	scratch []byte
	msg     control.Message
}

// end is the control socket's end: the reservation goes, and with it the
// computer's phones.
func (r *controlReader) end(error) {
	r.h.m.computers.Dec()
	r.h.group.Remove(r.conn)
	r.hc.End()
	r.h.log.Info("control socket closed", "host", r.host, "code", r.conn.CloseCode())
}

func (r *controlReader) frame(op int, frame []byte) bool {
	h := r.h
	if op != ws.OpText {
		h.m.malformed.Inc()
		r.conn.Close(ws.ClosePolicyViolation, "binary control frame")
		return false
	}
	if r.p == nil {
		r.p = new(controlParse)
	}
	p := r.p
	var err error
	p.msg, p.scratch, err = control.Parse(frame, p.scratch)
	if err != nil {
		h.m.malformed.Inc()
		h.log.Info("malformed control frame", "host", r.host, "err", err)
		r.conn.Close(ws.ClosePolicyViolation, "malformed control frame")
		return false
	}
	// An id that is gone (the phone just left) or another computer's
	// reaches nobody.
	if p.msg.Type == control.TypeClose {
		r.hc.ClosePhone(&p.msg.ID)
	} else if r.hc.ToPhone(&p.msg.ID, p.msg.Data) {
		h.m.toPhone.Inc()
	}
	// Frames above the pooled size should not pin memory.
	if cap(p.scratch) > 4*MaxFrame {
		p.scratch = nil
	}
	return true
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
	ws.Upgrade(ctx, h.phone, "", hp.End, func(conn *ws.Conn) {
		if !h.group.Add(conn) {
			hp.End()
			conn.Close(ws.CloseGoingAway, "server shutting down")
			return
		}
		actx, cancel := context.WithTimeout(context.Background(), routeTimeout)
		attached := hp.Attach(actx, conn)
		cancel()
		if !attached {
			h.group.Remove(conn)
			hp.End()
			conn.Close(ws.CloseGoingAway, "computer offline")
			return
		}
		h.m.phones.Inc()
		r := &phoneReader{h: h, hp: hp, conn: conn}
		conn.Serve(r.frame, r.end)
	})
}

// A phoneReader takes a phone's frames: what an idle phone channel keeps
// of the handler (its methods are the socket's callbacks, no closures).
type phoneReader struct {
	h    *Handler
	hp   route.ChannelPhone
	conn *ws.Conn
}

func (r *phoneReader) end(error) {
	r.h.m.phones.Dec()
	r.h.group.Remove(r.conn)
	r.hp.End()
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

// frame forwards one of the phone's frames to its computer, wrapped in a
// data control message; false ends the phone's reading (1009 for an
// oversized frame is sent by the reader).
func (r *phoneReader) frame(op int, frame []byte) bool {
	if op != ws.OpText {
		r.conn.Close(ws.CloseUnsupportedData, "binary frames are not accepted")
		return false
	}
	if err := r.hp.ToHost(frame); err != nil {
		return false // the control socket is gone or being dropped
	}
	r.h.m.toComputer.Inc()
	return true
}
