package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/ndjson"
	"edgerelay/fastpath/sendq"
	"edgerelay/fastpath/ws"
	"edgerelay/route"
	"edgerelay/store"
)

// UpgradeProtocol is the token of the instance link's HTTP/1.1 upgrade. The
// connector accepts exactly this token back.
const UpgradeProtocol = "contenox-relay/1"

// The answer to a good upgrade. Written by the hijacked goroutine itself
// (see connect).
var switching = []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + UpgradeProtocol + "\r\nConnection: Upgrade\r\n\r\n")

// Reasons a link ends (edgerelay_agent_links_closed_total).
const (
	endEOF       = "eof"
	endReplaced  = "replaced"
	endHeartbeat = "heartbeat_timeout"
	endTooLong   = "line_too_long"
	endTruncated = "truncated"
	endRevoked   = "revoked"
	endDrain     = "drain"
	endFenced    = "fenced"
	endOverflow  = "overflow"
	endError     = "error"
)

// link is one instance link: a hijacked TLS connection carrying NDJSON.
// The goroutine fasthttp hands the connection to reads it; the queue's
// goroutine writes it; a third probes it when it goes quiet.
type link struct {
	h   *Handler
	in  *instance
	gen uint64 // order of authentication: the newest link wins
	nc  net.Conn
	r   *ndjson.Reader
	q   *sendq.Queue
	// share is who holds the queue's bytes, for remoteLink.Offer; every
	// put into q is counted in it.
	share share
	done  chan struct{} // closed when the link has ended entirely
	// hold is the link's hold on its instance in the route, from its
	// install to its end; set and used by the reading goroutine.
	hold route.AgentLinkHold

	// Scratch buffers of the reading goroutine.
	out []byte // frames the relay answers with
	msg []byte // error messages
	key []byte // a session decoded from escapes

	lastRecv  atomic.Int64  // mono time of the last line read
	probeN    atomic.Uint64 // number of the last probe sent
	probeSent atomic.Int64  // mono time the outstanding probe was sent; 0: none

	closed atomic.Bool
	// mu guards reason and finished, and is held while another goroutine
	// touches the connection: once the hijack handler has returned,
	// fasthttp reuses the net.Conn, so close and abort must not reach it
	// after finishLink has marked the link finished.
	mu       sync.Mutex
	reason   string // why the link ends; the first reason given wins
	finished bool
}

// endWith records why the link ends, unless a reason was recorded before.
func (l *link) endWith(reason string) {
	l.mu.Lock()
	if l.reason == "" {
		l.reason = reason
	}
	l.mu.Unlock()
}

func (l *link) endReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// close ends the link gracefully: what is queued is still written (within
// CloseTimeout), and the reader is woken. Any goroutine may call it, any
// number of times.
func (l *link) close(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason == "" {
		l.reason = reason
	}
	if l.finished {
		return
	}
	l.closed.Store(true)
	l.q.Close()
	_ = l.nc.SetReadDeadline(time.Unix(1, 0))
}

// abort ends the link at once, dropping what is queued: the runtime is not
// reading, so nothing more will reach it anyway.
func (l *link) abort(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason == "" {
		l.reason = reason
	}
	if l.finished {
		return
	}
	l.closed.Store(true)
	l.q.Abort()
	_ = l.nc.SetDeadline(time.Unix(1, 0))
}

// setReadDeadline sets a read deadline unless the link is closing: a close
// that woke the reader just before must not be undone.
func (l *link) setReadDeadline(t time.Time) {
	_ = l.nc.SetReadDeadline(t)
	if l.closed.Load() {
		_ = l.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// send queues one frame the relay wrote itself. A queue full even into its
// reserve means the runtime stopped reading: the link is dropped.
func (l *link) send(frame []byte) {
	err := l.q.TryPut(frame, true)
	if err == nil {
		l.share.counted(len(frame) + 1)
	}
	if errors.Is(err, sendq.ErrFull) {
		l.abort(endOverflow)
	}
}

// connect serves GET /v1/connect: authenticate the bearer, upgrade, and
// hand the connection to serveLink.
func (h *Handler) connect(ctx *fasthttp.RequestCtx) {
	// An HTTP/1.0 server must ignore Upgrade (RFC 9110 7.8): such a
	// request is no upgrade.
	if !ctx.IsGet() || !ctx.Request.Header.IsHTTP11() ||
		!headerHasToken(ctx.Request.Header.Peek("Connection"), "upgrade") ||
		!headerHasToken(ctx.Request.Header.Peek("Upgrade"), UpgradeProtocol) {
		h.m.refused.WithLabelValues("not_upgrade").Inc()
		answerError(ctx, fasthttp.StatusBadRequest, "GET with Upgrade: contenox-relay/1 required")
		return
	}
	// 401 and 403 make the connector give up for good, so they answer a
	// bad token and nothing else: every other refusal is retryable.
	tok := httpx.Bearer(ctx)
	if tok == nil {
		h.m.refused.WithLabelValues("no_bearer").Inc()
		answerError(ctx, fasthttp.StatusUnauthorized, "instance token required")
		return
	}
	rec, err := h.cfg.Store.InstanceByToken(httpx.Hash(tok))
	if errors.Is(err, store.ErrUnknownToken) {
		h.m.refused.WithLabelValues("bad_token").Inc()
		answerError(ctx, fasthttp.StatusForbidden, "unknown or revoked instance token")
		return
	}
	if err != nil {
		h.m.refused.WithLabelValues("store_error").Inc()
		h.log.Error("instance token lookup failed", "err", err)
		answerError(ctx, fasthttp.StatusServiceUnavailable, "try again later")
		return
	}
	in := h.acquire(rec.ID)
	if in == nil {
		h.m.refused.WithLabelValues("draining").Inc()
		answerError(ctx, fasthttp.StatusServiceUnavailable, "relay shutting down")
		return
	}
	in.mu.Lock()
	in.newest++
	gen := in.newest
	in.mu.Unlock()

	// The 101 is written by the hijacked goroutine itself rather than by
	// fasthttp: fasthttp skips the hijack handler when its own flush of
	// the answer fails, and the reference taken above would then never be
	// released. When fasthttp drops the connection before handing it over
	// at all (answers pipelined before the upgrade that cannot be flushed),
	// ws.Hijack gives the reference back instead.
	ws.Hijack(ctx, func() { h.release(in) }, func(nc net.Conn) {
		defer h.release(in)
		h.serveLink(in, gen, nc)
	})
}

// serveLink runs one link from the 101 to its end.
func (h *Handler) serveLink(in *instance, gen uint64, nc net.Conn) {
	l := &link{h: h, in: in, gen: gen, nc: nc, done: make(chan struct{})}
	l.q = sendq.New(nc, sendq.Options{MaxBytes: h.cfg.LinkQueue, WriteTimeout: h.cfg.WriteTimeout})
	l.r = ndjson.NewReader(nc, 0)
	defer close(l.done)
	defer h.finishLink(l)
	h.mu.Lock()
	if h.draining {
		h.mu.Unlock()
		h.m.handshakes.WithLabelValues("draining").Inc()
		return // no 101: the connector sees the connection end and retries
	}
	h.links[l] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.links, l)
		h.mu.Unlock()
	}()

	// The HTTP server's deadlines do not apply to the link; heartbeats
	// decide when it is dead. The 101 itself is bounded like a close, and
	// written before anything can be queued, so nothing overtakes it.
	_ = nc.SetDeadline(time.Now().Add(h.cfg.CloseTimeout))
	if _, err := nc.Write(switching); err != nil {
		return
	}
	_ = nc.SetDeadline(time.Time{})

	l.setReadDeadline(time.Now().Add(h.cfg.HelloTimeout))
	welcome, ok := h.handshake(l)
	if !ok {
		return
	}
	l.setReadDeadline(time.Time{})
	if !h.install(l, welcome) {
		return
	}
	h.m.links.Inc()
	h.log.Info("instance link open", "instance", in.name, "remote", nc.RemoteAddr().String())
	l.lastRecv.Store(h.mono())
	go h.probeLoop(l)

	h.readLink(l)

	in.mu.Lock()
	if in.link == l {
		in.link = nil
		in.cur.Store(nil)
	}
	in.mu.Unlock()
	l.hold.Release()
	h.m.links.Dec()
	reason := l.endReason()
	h.m.linkEnds.WithLabelValues(reason).Inc()
	h.log.Info("instance link closed", "instance", in.name, "reason", reason)
}

// install makes l the instance's link, queueing the welcome first so that
// nothing can reach the runtime before it. The newest link wins: an older
// link is closed, and a link older than the one installed gives up.
func (h *Handler) install(l *link, welcome []byte) bool {
	in := l.in
	// A revocation that finished before this link took its reference is
	// only visible in the store.
	rec, err := h.cfg.Store.Instance(in.name)
	if err != nil {
		// The store did not answer (a cluster without quorum): the link
		// closes and the runtime redials, as after any cut.
		h.m.handshakes.WithLabelValues("store_unavailable").Inc()
		return false
	}
	if rec.Revoked {
		h.m.handshakes.WithLabelValues("superseded").Inc()
		return false
	}
	in.mu.Lock()
	old := in.link
	if in.revoked || l.closed.Load() || (old != nil && old.gen > l.gen) {
		in.mu.Unlock()
		h.m.handshakes.WithLabelValues("superseded").Inc()
		return false
	}
	// The welcome waits in the queue until the route holds the link (see
	// below), and so does any line the route hands the link meanwhile.
	l.q.Hold()
	defer l.q.Release()
	if err := l.q.TryPut(welcome, true); err != nil {
		in.mu.Unlock()
		return false
	}
	l.share.counted(len(welcome) + 1)
	in.link = l
	in.cur.Store(l)
	in.mu.Unlock()
	if old != nil {
		old.close(endReplaced)
	}
	// The route learns of the link once its welcome is queued, so that
	// no client's line from another node can overtake the welcome; the
	// runtime hears the welcome only once the route holds the link, so
	// that a client attaching through another node after the welcome
	// finds the instance online there (its node reads the route's lease:
	// a welcome written first let such a client's first request be
	// answered unknown_instance).
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.HelloTimeout)
	hold, err := h.cfg.Route.Link(ctx, in.name, remoteLink{l})
	cancel()
	if err != nil {
		// Like a store that does not answer above: no welcome (it is
		// dropped with the queue), the runtime redials.
		h.log.Error("instance link: route unavailable", "instance", in.name, "err", err)
		h.m.handshakes.WithLabelValues("store_unavailable").Inc()
		in.mu.Lock()
		if in.link == l {
			in.link = nil
			in.cur.Store(nil)
		}
		in.mu.Unlock()
		l.abort(endError)
		return false
	}
	h.m.handshakes.WithLabelValues("welcome").Inc()
	l.hold = hold
	return true
}

// finishLink flushes what is queued (bounded by CloseTimeout) and closes
// the connection.
func (h *Handler) finishLink(l *link) {
	l.closed.Store(true)
	l.q.Close()
	t := time.NewTimer(h.cfg.CloseTimeout)
	select {
	case <-l.q.Done():
	case <-t.C:
		l.q.Abort()
		_ = l.nc.SetDeadline(time.Unix(1, 0))
		<-l.q.Done()
	}
	t.Stop()
	// A deadline in the past wakes anything still blocked on the socket;
	// fasthttp closes it when the hijack handler returns. From here on
	// nobody else touches it.
	l.mu.Lock()
	l.finished = true
	_ = l.nc.SetDeadline(time.Unix(1, 0))
	l.mu.Unlock()
}

// readLink reads the runtime's frames until the link ends. This is the
// routing path from instances to clients: nothing here allocates per line.
func (h *Handler) readLink(l *link) {
	for {
		line, err := l.r.Next()
		if err != nil {
			switch {
			case errors.Is(err, ndjson.ErrLineTooLong):
				// Terminal: the stream cannot be resynchronised.
				l.endWith(endTooLong)
			case errors.Is(err, ndjson.ErrTruncated):
				l.endWith(endTruncated)
			case errors.Is(err, io.EOF):
				l.endWith(endEOF)
			default:
				l.endWith(endError)
			}
			return
		}
		l.lastRecv.Store(h.mono())
		f, err := ndjson.Scan(line)
		if err != nil {
			h.m.dropLinkMalformed.Inc()
			continue
		}
		if f.IsControl(line) {
			h.linkControl(l, line, &f)
			continue
		}
		h.toClient(l, line, &f)
	}
}

// toClient routes one cargo line from the instance to the attachment its
// session names, as the bytes that arrived (without the line feed).
func (h *Handler) toClient(l *link, line []byte, f *ndjson.Frame) {
	if !f.Session.Present() {
		h.m.dropNoSession.Inc()
		return
	}
	in := l.in
	// session needs instance (Scan checked), and it must be this one.
	if !f.Instance.Equal(line, in.name) {
		h.m.dropWrongInstance.Inc()
		return
	}
	key := f.Session.Raw(line)
	if f.Session.Escaped {
		l.key = f.Session.AppendValue(l.key[:0], line)
		key = l.key
	}
	var a *attachment
	if routes := in.routes.Load(); routes != nil {
		a = (*routes)[string(key)]
	}
	if a == nil {
		// Not a client of this node: perhaps of another one's.
		if l.hold.ToSession(key, line) {
			h.m.toClient.Inc()
		} else {
			h.m.dropUnknownSession.Inc()
		}
		return
	}
	h.queueFor(a, line, l.out[:0])
}

// queueFor queues a line of the instance for a, within a's queue and the
// instance's bound on all its clients (InstanceQueue), whether the link is
// on this node or another. scratch is the calling goroutine's buffer for
// a detach.
func (h *Handler) queueFor(a *attachment, line, scratch []byte) {
	in := a.in
	// The instance's budget first: in.queued overestimates what its
	// clients' queues hold, so while the frame fits under it nothing more
	// is asked; when it does not, makeRoom finds out, and closes the
	// slowest clients if it must.
	n := int64(len(line) + 10) // the frame with the longest header
	if in.queued.Load()+n > int64(h.cfg.InstanceQueue) && !h.makeRoom(scratch, a, n) {
		h.m.dropClientOverflow.Inc()
		return
	}
	// A full queue closes that client with 1013 and detaches it at once;
	// the instance and every other client keep flowing.
	if err := a.conn.WriteText(line); err != nil {
		h.m.dropClientOverflow.Inc()
		if errors.Is(err, ws.ErrQueueFull) && h.detach(a, scratch) {
			h.m.slowClientQueue.Inc()
		}
		return
	}
	a.charged.Add(n)
	in.queued.Add(n)
	h.m.toClient.Inc()
}

// makeRoom is called when a frame of n bytes for a would take the
// instance's estimate past InstanceQueue. It asks every attachment's queue
// what it holds, and while the frame still does not fit, closes the
// attachment holding the most with 1013 (its backlog is dropped, as at an
// overflow of its own queue) and detaches it (scratch: the caller's buffer
// for the detach). It reports whether a is
// still attached to take the frame. The error path, so it may take time
// in proportion to the attachments; it allocates nothing.
func (h *Handler) makeRoom(scratch []byte, a *attachment, n int64) bool {
	in := a.in
	budget := int64(h.cfg.InstanceQueue)
	in.making.Lock()
	defer in.making.Unlock()
	// Each round detaches one attachment; the bound only guards against a
	// detach that another goroutine has begun and not yet published.
	for range h.cfg.MaxAttachments + 1 {
		routes := in.routes.Load()
		if routes == nil {
			return false
		}
		var total int64
		var slowest *attachment
		most := int64(-1)
		for _, b := range *routes {
			if b.detached.Load() {
				continue // closed on another path, leaving the routes
			}
			q := int64(b.conn.Queued())
			b.charged.Store(q)
			total += q
			if q > most {
				slowest, most = b, q
			}
		}
		in.queued.Store(total)
		if total+n <= budget || slowest == nil {
			return true
		}
		slowest.conn.CloseOverflow()
		if h.detach(slowest, scratch) {
			h.m.slowClientInstance.Inc()
			h.log.Info("client closed: the instance's clients hold too much unsent", "instance", in.name, "queued", total)
		}
		if slowest == a {
			return false
		}
	}
	return false
}

// linkControl handles a relay.* frame from the instance.
func (h *Handler) linkControl(l *link, line []byte, f *ndjson.Frame) {
	switch {
	case f.Type.Equal(line, typeAck):
		if n := parseProbe(f.Re.Raw(line)); n != 0 && n == l.probeN.Load() {
			l.probeSent.Store(0)
		}
	case !f.ID.Present() || f.Re.Present():
		// Notifications and responses are never answered.
	case f.Type.Equal(line, typeHeartbeat):
		l.out = appendAck(l.out[:0], f.Instance.Raw(line), f.Session.Raw(line), f.ID.Raw(line))
		l.send(l.out)
	case f.Type.Equal(line, typeHello):
		// There is one welcome per link, never a second.
		l.msg = append(l.msg[:0], "hello after the welcome"...)
		l.out = appendError(l.out[:0], f.Instance.Raw(line), f.Session.Raw(line), f.ID.Raw(line), codeMalformedFrame, l.msg)
		l.send(l.out)
	default:
		l.key = f.Type.AppendValue(l.key[:0], line)
		l.msg = appendUnsupportedMessage(l.msg[:0], l.key)
		l.out = appendError(l.out[:0], f.Instance.Raw(line), f.Session.Raw(line), f.ID.Raw(line), codeUnsupportedType, l.msg)
		l.send(l.out)
	}
}

// probeLoop sends relay.heartbeat when the link has been quiet for
// HeartbeatEvery and drops the link when a probe goes HeartbeatTimeout
// without its ack.
func (h *Handler) probeLoop(l *link) {
	every, timeout := int64(h.cfg.HeartbeatEvery), int64(h.cfg.HeartbeatTimeout)
	t := time.NewTimer(h.cfg.HeartbeatEvery)
	defer t.Stop()
	var buf []byte
	for {
		select {
		case <-t.C:
		case <-l.done:
			return
		}
		if l.closed.Load() {
			return
		}
		now := h.mono()
		if sent := l.probeSent.Load(); sent != 0 {
			if wait := sent + timeout - now; wait > 0 {
				t.Reset(time.Duration(wait))
				continue
			}
			h.log.Info("instance link silent: no ack to the relay's heartbeat", "instance", l.in.name)
			l.abort(endHeartbeat)
			return
		}
		if wait := l.lastRecv.Load() + every - now; wait > 0 {
			t.Reset(time.Duration(wait))
			continue
		}
		n := l.probeN.Add(1)
		l.probeSent.Store(now)
		buf = appendProbe(buf[:0], l.in.id, n)
		l.send(buf)
		t.Reset(h.cfg.HeartbeatTimeout)
	}
}

// headerHasToken reports whether a comma-separated header value holds
// token, compared case-insensitively.
func headerHasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var part []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			part, v = v[:i], v[i+1:]
		} else {
			part, v = v, nil
		}
		if bytes.EqualFold(bytes.TrimSpace(part), []byte(token)) {
			return true
		}
	}
	return false
}
