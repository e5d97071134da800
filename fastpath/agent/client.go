package agent

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ndjson"
	"edgerelay/fastpath/sendq"
	"edgerelay/fastpath/ws"
	"edgerelay/route"
	"edgerelay/store"
)

// Subprotocol is the WebSocket subprotocol of client attachments.
const Subprotocol = "contenox-relay.v1"

// bearerProtocol prefixes the subprotocol that carries a browser's client
// token (browsers cannot set Authorization on a WebSocket). It is never
// echoed.
const bearerProtocol = "bearer."

// maxKeptBuffer is the largest splice buffer an attachment keeps between
// messages; one grown past it for a big message is given back.
const maxKeptBuffer = 1 << 20

// attachment is one attached client.
type attachment struct {
	id   []byte // the attachment id: the session of its frames
	name string // the same, for maps
	in   *instance
	conn *ws.Conn
	// slot is the attachment's place on its instance in the route.
	slot route.AgentAttachment
	// live is set once conn is set and the attachment registered: lines
	// from another node's link reach conn only from then on.
	live atomic.Bool
	// detached is set once the instance has been told the client left.
	detached atomic.Bool
	// fenced is set when the cluster fenced this node (remoteClient.Fenced).
	fenced atomic.Bool
	// charged is this attachment's share of in.queued: what its queue
	// held when makeRoom last asked, plus the frames routed to it since.
	charged atomic.Int64

	// Scratch buffers of the client's reading goroutine.
	buf []byte // the spliced line
	out []byte // answers from the relay
	msg []byte // error messages
}

// attach serves GET /v1/attach/<instance id>.
func (h *Handler) attach(ctx *fasthttp.RequestCtx, id []byte) {
	tok := httpx.Bearer(ctx)
	offered := false
	ws.Subprotocols(ctx, func(p []byte) bool {
		switch {
		case bytes.Equal(p, []byte(Subprotocol)):
			offered = true
		case tok == nil && bytes.HasPrefix(p, []byte(bearerProtocol)) && len(p) > len(bearerProtocol):
			tok = p[len(bearerProtocol):]
		}
		return true
	})
	if tok == nil {
		h.m.refused.WithLabelValues("no_bearer").Inc()
		answerError(ctx, fasthttp.StatusUnauthorized, "client token required")
		return
	}
	acct, err := h.cfg.Store.AccountByClientToken(httpx.Hash(tok))
	if errors.Is(err, store.ErrUnknownToken) {
		h.m.refused.WithLabelValues("bad_token").Inc()
		answerError(ctx, fasthttp.StatusUnauthorized, "unknown client token")
		return
	}
	if err != nil {
		h.m.refused.WithLabelValues("store_error").Inc()
		h.log.Error("client token lookup failed", "err", err)
		answerError(ctx, fasthttp.StatusServiceUnavailable, "try again later")
		return
	}
	if err := ws.CheckHandshake(ctx); err != nil {
		h.m.refused.WithLabelValues("not_upgrade").Inc()
		if status := ws.Refusal(ctx, err); status == fasthttp.StatusUpgradeRequired {
			answerError(ctx, status, "unsupported websocket version")
		} else {
			answerError(ctx, status, "not a websocket handshake")
		}
		return
	}
	if len(id) == 0 || len(id) > ndjson.MaxIDLen || bytes.IndexByte(id, '/') >= 0 {
		h.m.refused.WithLabelValues("wrong_account").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "not an instance of this account")
		return
	}
	in := h.acquire(string(id))
	if in == nil {
		h.m.refused.WithLabelValues("draining").Inc()
		answerError(ctx, fasthttp.StatusServiceUnavailable, "relay shutting down")
		return
	}
	// Checked after the reference is taken, so that a revocation either
	// shows here or finds this entry and marks it (see disconnect). An
	// instance that does not exist and one of another account get the
	// same answer.
	rec, err := h.cfg.Store.Instance(in.name)
	if err != nil && !errors.Is(err, store.ErrUnknownInstance) {
		h.release(in)
		h.m.refused.WithLabelValues("store_error").Inc()
		h.log.Error("instance lookup failed", "err", err)
		answerError(ctx, fasthttp.StatusServiceUnavailable, "try again later")
		return
	}
	if err != nil || rec.Revoked || rec.Account != acct.ID {
		h.release(in)
		h.m.refused.WithLabelValues("wrong_account").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "not an instance of this account")
		return
	}
	in.mu.Lock()
	if in.revoked {
		in.mu.Unlock()
		h.release(in)
		h.m.refused.WithLabelValues("wrong_account").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "not an instance of this account")
		return
	}
	if len(in.atts)+in.reserved >= h.cfg.MaxAttachments {
		in.mu.Unlock()
		h.release(in)
		h.m.refused.WithLabelValues("too_many_attachments").Inc()
		answerError(ctx, fasthttp.StatusTooManyRequests, "too many attachments to this instance")
		return
	}
	in.reserved++
	in.mu.Unlock()

	a := &attachment{name: newID("att-"), in: in}
	a.id = []byte(a.name)
	// The slot in the route makes the limit hold over every node (on
	// one, the count above already did).
	slot, err := h.cfg.Route.Attach(ctx, in.name, a.name, h.cfg.MaxAttachments, remoteClient{h, a})
	if err != nil {
		in.mu.Lock()
		in.reserved--
		in.mu.Unlock()
		h.release(in)
		if errors.Is(err, route.ErrAgentFull) {
			h.m.refused.WithLabelValues("too_many_attachments").Inc()
			answerError(ctx, fasthttp.StatusTooManyRequests, "too many attachments to this instance")
			return
		}
		h.m.refused.WithLabelValues("store_error").Inc()
		h.log.Error("attachment slot unavailable", "err", err)
		answerError(ctx, fasthttp.StatusServiceUnavailable, "try again later")
		return
	}
	a.slot = slot

	echo := ""
	if offered {
		echo = Subprotocol
	}
	// serve turns the reservation into an attachment (serveClient) and
	// drops the reference at the end; abandon gives both back when
	// fasthttp drops the connection before serve runs.
	abandon := func() {
		in.mu.Lock()
		in.reserved--
		in.mu.Unlock()
		a.slot.Leave(nil)
		h.release(in)
	}
	ws.Upgrade(ctx, h.clientWS, echo, abandon, func(conn *ws.Conn) {
		defer h.release(in)
		a.conn = conn
		h.serveClient(a)
	})
}

// serveClient runs one attachment from its 101 to its end.
func (h *Handler) serveClient(a *attachment) {
	in := a.in
	in.mu.Lock()
	in.reserved--
	if in.revoked {
		in.mu.Unlock()
		a.slot.Leave(nil)
		a.conn.Close(ws.ClosePolicyViolation, "instance revoked")
		return
	}
	in.atts[a.name] = a
	in.publishRoutesLocked()
	in.mu.Unlock()
	a.live.Store(true)
	if a.fenced.Load() {
		a.conn.Close(ws.CloseGoingAway, fencedReason)
	}
	if h.clients.Add(a.conn) {
		h.m.attachments.Inc()
		h.readClient(a)
		h.clients.Remove(a.conn)
		h.m.attachments.Dec()
	} else {
		a.conn.Close(ws.CloseGoingAway, "relay shutting down")
	}

	h.detach(a, a.out[:0])
}

// detach removes a from its instance and tells the runtime with
// acp.detach, once: when the client leaves, or as soon as its queue
// overflows (its socket may take a while longer to close). buf is scratch
// owned by the calling goroutine. It reports whether this call detached
// a: of several paths that close one client at once (its own queue, the
// instance's budget, a remote link's), only that one counts the close.
func (h *Handler) detach(a *attachment, buf []byte) bool {
	if !a.detached.CompareAndSwap(false, true) {
		return false
	}
	in := a.in
	in.mu.Lock()
	if in.atts[a.name] == a {
		delete(in.atts, a.name)
		in.publishRoutesLocked()
		in.queued.Add(-a.charged.Swap(0))
	}
	l := in.link
	in.mu.Unlock()
	if l != nil {
		l.send(appendDetach(buf, in.id, a.id))
		a.slot.Leave(nil)
		return true
	}
	// The link is elsewhere, or nowhere: the route tells it, if anywhere.
	a.slot.Leave(appendDetach(buf, in.id, a.id))
	return true
}

// readClient reads the client's messages until it leaves or is closed.
// This is the routing path from clients to instances: nothing here
// allocates per frame once the buffers have grown.
func (h *Handler) readClient(a *attachment) {
	for {
		op, msg, err := a.conn.ReadMessage()
		if err != nil {
			return
		}
		if op != ws.OpText {
			a.conn.Close(ws.CloseUnsupportedData, "text messages only")
			return
		}
		// ScanMessage refuses a raw line feed or carriage return even
		// where JSON would call it whitespace: the message must never
		// become two lines on the link.
		f, err := ndjson.ScanMessage(msg)
		if err != nil {
			h.m.dropClientMalformed.Inc()
			h.answerMalformed(a, msg, err)
			continue
		}
		if f.IsControl(msg) {
			h.clientControl(a, msg, &f)
			continue
		}
		h.toInstance(a, msg, &f)
	}
}

// toInstance routes one client frame to the instance link with instance
// and session set to the attachment's, every other byte as it came.
func (h *Handler) toInstance(a *attachment, msg []byte, f *ndjson.Frame) {
	in := a.in
	a.buf = ndjson.Splice(a.buf[:0], msg, *f, in.id, a.id)
	if len(a.buf)+1 > ndjson.MaxLine {
		// The runtime would have to close the link on such a line.
		h.m.dropTooLong.Inc()
		if f.ID.Present() {
			h.answer(a, f.ID.Raw(msg), codeMalformedFrame, "frame longer than the line limit")
		}
		return
	}
	// Two tries: a link replaced while this frame waited for room is
	// closed under it, and the frame goes to the new one.
	for range 2 {
		l := in.cur.Load()
		if l == nil {
			break
		}
		err := l.q.Put(a.buf, true, a.conn.Done())
		if err == nil {
			l.share.counted(len(a.buf) + 1)
			h.m.toInstance.Inc()
			if cap(a.buf) > maxKeptBuffer {
				a.buf = nil
			}
			return
		}
		if errors.Is(err, sendq.ErrTooBig) || in.cur.Load() == l {
			break
		}
	}
	// No link on this node: perhaps on another one.
	if in.cur.Load() == nil && a.slot.ToInstance(a.buf) {
		h.m.toInstance.Inc()
		if cap(a.buf) > maxKeptBuffer {
			a.buf = nil
		}
		return
	}
	h.m.dropOffline.Inc()
	if f.ID.Present() {
		h.answer(a, f.ID.Raw(msg), codeUnknownInstance, "the instance is offline")
	}
}

// clientControl handles a relay.* frame from a client: never forwarded.
func (h *Handler) clientControl(a *attachment, msg []byte, f *ndjson.Frame) {
	if !f.ID.Present() || f.Re.Present() {
		return // notifications and responses are never answered
	}
	if f.Type.Equal(msg, typeHeartbeat) {
		a.out = appendAck(a.out[:0], a.in.id, a.id, f.ID.Raw(msg))
		_ = a.conn.WriteText(a.out)
		return
	}
	a.buf = f.Type.AppendValue(a.buf[:0], msg)
	a.msg = appendUnsupportedMessage(a.msg[:0], a.buf)
	a.out = appendError(a.out[:0], a.in.id, a.id, f.ID.Raw(msg), codeUnsupportedType, a.msg)
	_ = a.conn.WriteText(a.out)
}

// answer sends the client a relay.error for its request whose raw id is re.
func (h *Handler) answer(a *attachment, re []byte, code, message string) {
	a.msg = append(a.msg[:0], message...)
	a.out = appendError(a.out[:0], a.in.id, a.id, re, code, a.msg)
	_ = a.conn.WriteText(a.out)
}

// answerMalformed answers malformed_frame if the dropped message was a
// request: one whose top-level object, as far as it goes, has an id
// (requestID), however deep it nests or wherever it breaks. An id that
// could not be a valid re is not answered.
func (h *Handler) answerMalformed(a *attachment, msg []byte, cause error) {
	id := requestID(msg)
	if !usableID(id) {
		return
	}
	re := ndjson.AppendString(nil, id)
	message := "malformed frame"
	switch {
	case errors.Is(cause, ndjson.ErrField):
		message = "malformed frame: " + strings.TrimPrefix(cause.Error(), "ndjson: ")
	case bytes.ContainsAny(msg, "\r\n"):
		message = "malformed frame: a raw line break"
	case errors.Is(cause, ndjson.ErrTooDeep):
		message = "malformed frame: nested deeper than " + strconv.Itoa(ndjson.MaxDepth) + " levels"
	}
	h.answer(a, re[1:len(re)-1], codeMalformedFrame, message)
}

// usableID reports whether id can be echoed as re: what the spec allows
// of an id.
func usableID(id []byte) bool {
	if len(id) == 0 || len(id) > ndjson.MaxIDLen || !utf8.Valid(id) {
		return false
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}
