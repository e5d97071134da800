package pushgw

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/server"
	"edgerelay/store"
)

// scratch is the per-request memory of /send and /register, pooled: the
// body, the decoded strings, the data entries and the provider request.
type scratch struct {
	body    []byte
	p       parser
	entries []entry
	msg     sendMessage
	out     []byte
}

func newScratch() *scratch {
	return &scratch{
		body:    make([]byte, 0, MaxBodyBytes+1),
		p:       parser{arena: make([]byte, 0, 2048)},
		entries: make([]entry, 0, maxDataFields),
		msg:     sendMessage{data: make([]dataEntry, 0, maxDataFields)},
		out:     make([]byte, 0, 2048),
	}
}

func (h *Handler) getScratch() *scratch { return h.scratch.Get().(*scratch) }

func (h *Handler) putScratch(s *scratch) {
	// A request that grew a buffer far past the usual is not kept.
	if cap(s.p.arena) > 4*MaxBodyBytes || cap(s.out) > 4*MaxBodyBytes {
		return
	}
	s.msg.token, s.msg.title, s.msg.body = nil, nil, nil
	h.scratch.Put(s)
}

// readBody reads the request body into buf, at most limit bytes.
// tooLarge reports a body over limit: a Content-Length over it is refused
// without reading a byte of the body; a body without one is read until it
// turns out too long.
//
// A body the listener withheld (see AnswersFromHeaders) is too large when
// its declared length is; otherwise it is errBodyWithheld.
func readBody(ctx *fasthttp.RequestCtx, limit int, buf []byte) (body []byte, tooLarge bool, err error) {
	if declared, ok := server.BodyWithheld(ctx); ok {
		if declared > limit {
			return nil, true, nil
		}
		return nil, false, errBodyWithheld
	}
	if ctx.Request.Header.ContentLength() > limit {
		return nil, true, nil
	}
	stream := ctx.RequestBodyStream()
	if stream == nil {
		// The listener read the body already (StreamRequestBody off); its
		// own limit refused anything past MaxBodyBytes.
		b := ctx.PostBody()
		return b, len(b) > limit, nil
	}
	buf = buf[:0]
	if cap(buf) < limit+1 {
		buf = make([]byte, 0, limit+1)
	}
	for {
		n, rerr := stream.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			return nil, true, nil
		}
		if errors.Is(rerr, io.EOF) {
			return buf, false, nil
		}
		if rerr != nil {
			return nil, false, rerr
		}
		if len(buf) == cap(buf) {
			return nil, true, nil // unreachable: cap is limit+1
		}
	}
}

// send is POST /send. The checks run in the spec's order, each for a
// reason: validation before any limit, so that bad calls spend no quota;
// the minute limit before the claim, because a claim is a durable write;
// the claim before delivery, so that a stranger's first send cannot win a
// token; the budget after the claim, so that sends refused at the claim
// never spend it.
func (h *Handler) send(ctx *fasthttp.RequestCtx, r *request) {
	// 1-3: the API key.
	tok := httpx.Bearer(ctx)
	if tok == nil {
		h.denied(ctx, r, "", fasthttp.StatusUnauthorized, "missing api key", "missing_api_key")
		return
	}
	key, ok := h.store.KeyByHash(sha256.Sum256(tok))
	if !ok || !key.Enabled {
		h.denied(ctx, r, "", fasthttp.StatusUnauthorized, "invalid api key", "invalid_api_key")
		return
	}
	now := h.now()
	h.sweep(now)
	if key.Expired(now) {
		var buf [192]byte
		b := appendErrorHead(buf[:0], r, "api key expired")
		b = append(b, `,"expiresAt":"`...)
		b = appendISOTime(b, key.ExpiresAt)
		h.json(ctx, r, fasthttp.StatusUnauthorized, append(b, `"}`...))
		h.event(r, slog.LevelInfo, "send.denied", key.ID, slog.String("reason", "api_key_expired"))
		return
	}

	// 4: the body and its fields.
	sc := h.getScratch()
	defer h.putScratch(sc)
	body, tooLarge, err := readBody(ctx, MaxBodyBytes, sc.body)
	if tooLarge {
		h.denied(ctx, r, key.ID, fasthttp.StatusRequestEntityTooLarge, "request body too large", "body_too_large")
		return
	}
	if errors.Is(err, errBodyWithheld) {
		// The key was refused when the headers arrived and became usable
		// before the handler ran; the headers' verdict stands.
		h.denied(ctx, r, "", fasthttp.StatusUnauthorized, "invalid api key", "invalid_api_key")
		return
	}
	if err != nil {
		h.denied(ctx, r, key.ID, fasthttp.StatusBadRequest, errUnreadable, "body_unreadable")
		return
	}
	if cap(body) > cap(sc.body) {
		sc.body = body[:0]
	}
	var emsg string
	sc.entries, emsg = sc.p.parseSend(body, sc.entries, &sc.msg)
	if emsg != "" {
		h.denied(ctx, r, key.ID, fasthttp.StatusBadRequest, emsg, "invalid_request")
		return
	}
	msg := &sc.msg

	// 5: the provider.
	if h.sender == nil {
		h.fail(ctx, r, fasthttp.StatusInternalServerError, "relay not configured")
		h.event(r, slog.LevelError, "send.denied", key.ID, slog.String("reason", "not_configured"))
		return
	}

	// 6: the key's minute limit.
	ok, err = h.rate.Take(key.Hash, now)
	if err != nil {
		h.internal(ctx, r, "rate", err)
		return
	}
	if !ok {
		var buf [192]byte
		b := appendErrorHead(buf[:0], r, "rate limit exceeded")
		b = append(b, `,"window":"minute","limit":`...)
		b = strconv.AppendInt(b, int64(h.perMinute), 10)
		b = append(b, `,"retryAfterSeconds":60}`...)
		retryAfterHeader(ctx, retryMinute)
		h.json(ctx, r, fasthttp.StatusTooManyRequests, b)
		h.m.sends[sendRateLimited].Inc()
		h.event(r, slog.LevelInfo, "send.denied", key.ID, slog.String("reason", "rate_limited"))
		return
	}

	// 7: the device-token claim, settled exactly once on every path below
	// (the deferred call covers a panic).
	ticket, err := h.store.Claim(sha256.Sum256(msg.token), key.ID, now)
	if errors.Is(err, store.ErrTokenClaimed) {
		h.fail(ctx, r, fasthttp.StatusForbidden, "token is already bound to a different active api key")
		h.m.sends[sendClaimRefused].Inc()
		h.event(r, slog.LevelInfo, "send.denied", key.ID, slog.String("reason", "token_claimed"))
		return
	}
	if err != nil {
		h.internal(ctx, r, "claim", err)
		return
	}
	settled := false
	settle := func(ok bool) {
		if settled {
			return
		}
		settled = true
		if err := h.store.Settle(ticket, ok); err != nil {
			h.event(r, slog.LevelError, "send.error", key.ID, slog.String("stage", "settle"), slog.String("err", err.Error()))
		}
	}
	defer settle(false)

	// 8: the daily budget.
	var draw store.BudgetDraw
	if h.metered {
		var ok bool
		draw, ok, err = h.store.DrawBudget(h.budget, now)
		if err != nil {
			settle(false)
			h.internal(ctx, r, "budget", err)
			return
		}
		if !ok {
			settle(false)
			wait := secondsToMidnight(now)
			var buf [192]byte
			b := appendErrorHead(buf[:0], r, "relay daily budget exhausted")
			b = append(b, `,"window":"day","limit":`...)
			b = strconv.AppendInt(b, h.budget, 10)
			b = append(b, `,"retryAfterSeconds":`...)
			b = strconv.AppendInt(b, wait, 10)
			retryAfterHeader(ctx, wait)
			h.json(ctx, r, fasthttp.StatusTooManyRequests, append(b, '}'))
			h.m.sends[sendBudgetExhausted].Inc()
			h.event(r, slog.LevelWarn, "budget.exhausted", key.ID, slog.Int64("limit", h.budget))
			return
		}
	}

	// 9: delivery.
	d := h.sender.send(context.Background(), msg, sc.out)
	if c := d.clipped; c != nil {
		// Delivered clipped rather than refused by the provider for its size.
		h.event(r, slog.LevelInfo, "send.clipped", key.ID,
			slog.Int("bytes", c.from), slog.Int("clippedTo", c.to), slog.Int("limit", c.limit))
	}
	if d.notSent && h.metered {
		h.store.RefundBudget(draw)
		h.m.refunds.Inc()
	}
	settle(d.outcome == delivered)
	switch d.outcome {
	case delivered:
		h.json(ctx, r, fasthttp.StatusOK, []byte(`{"ok":true}`))
		h.m.sends[sendOK].Inc()
		h.event(r, slog.LevelInfo, "send.ok", key.ID)
	case stale:
		var buf [96]byte
		b := append(buf[:0], `{"stale":true,"requestId":"`...)
		b = append(b, r.id[:]...)
		h.json(ctx, r, fasthttp.StatusGone, append(b, `"}`...))
		h.m.sends[sendStale].Inc()
		h.event(r, slog.LevelInfo, "send.stale", key.ID, slog.Int("providerStatus", d.status), slog.String("reason", clipDetail(d.detail)))
	case refused:
		h.fail(ctx, r, fasthttp.StatusBadGateway, "push delivery failed")
		h.m.sends[sendFailed].Inc()
		h.event(r, slog.LevelWarn, "send."+h.sender.name()+"_failed", key.ID,
			slog.Int("providerStatus", d.status), slog.String("reason", clipDetail(d.detail)))
	default:
		h.fail(ctx, r, fasthttp.StatusBadGateway, "push delivery failed")
		h.m.sends[sendErrored].Inc()
		h.event(r, slog.LevelError, "send.error", key.ID, slog.Bool("refunded", d.notSent && h.metered),
			slog.String("err", clipDetail(d.detail)))
	}
}

// denied answers a refusal before the claim and logs it.
func (h *Handler) denied(ctx *fasthttp.RequestCtx, r *request, keyID string, status int, msg, reason string) {
	h.fail(ctx, r, status, msg)
	h.event(r, slog.LevelInfo, "send.denied", keyID, slog.String("reason", reason))
}

// internal answers an unexpected failure; the cause goes to the log only.
func (h *Handler) internal(ctx *fasthttp.RequestCtx, r *request, stage string, err error) {
	if errors.Is(err, store.ErrUnavailable) { // nothing was changed; try again later
		ctx.Response.Header.Set("Retry-After", store.RetryAfter)
		h.fail(ctx, r, fasthttp.StatusServiceUnavailable, "storage unavailable")
		h.event(r, slog.LevelWarn, "storage_unavailable", "", slog.String("stage", stage))
		return
	}
	h.fail(ctx, r, fasthttp.StatusInternalServerError, "internal error")
	h.event(r, slog.LevelError, "internal_error", "", slog.String("stage", stage), slog.String("err", err.Error()))
}

// event logs one event line of a request. Never a key or a device token:
// the key id is the key's public name.
func (h *Handler) event(r *request, level slog.Level, event, keyID string, attrs ...slog.Attr) {
	if !h.log.Enabled(context.Background(), level) {
		return
	}
	all := make([]slog.Attr, 0, 4+len(attrs))
	all = append(all, slog.String("requestId", string(r.id[:])), slog.String("event", event))
	if keyID != "" {
		all = append(all, slog.String("keyId", keyID))
	}
	all = append(all, attrs...)
	h.log.LogAttrs(context.Background(), level, event, all...)
}

// secondsToMidnight is the wait until the next UTC midnight, rounded up,
// at least 1.
func secondsToMidnight(now time.Time) int64 {
	u := now.UTC()
	next := time.Date(u.Year(), u.Month(), u.Day()+1, 0, 0, 0, 0, time.UTC)
	s := int64((next.Sub(u) + time.Second - 1) / time.Second)
	return max(s, 1)
}

// appendISOTime writes t as JavaScript's toISOString does:
// 2025-01-02T03:04:05.678Z.
func appendISOTime(b []byte, t time.Time) []byte {
	return t.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
}
