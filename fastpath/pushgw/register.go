package pushgw

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/valyala/fasthttp"

	"edgerelay/store"
)

// registerKey is POST /register: anyone may mint an API key, one active
// key per address bucket, when the operator opened registration.
func (h *Handler) registerKey(ctx *fasthttp.RequestCtx, r *request) {
	if !h.register {
		h.fail(ctx, r, fasthttp.StatusForbidden, "self-registration is disabled")
		h.m.registrations[regDisabled].Inc()
		return
	}
	bucketName, ok := h.clientBucket(ctx)
	if !ok {
		// Fail closed: without a trustworthy address there is no bucket
		// to limit, and an unlimited /register is an open mint.
		h.fail(ctx, r, fasthttp.StatusServiceUnavailable, "registration is temporarily unavailable")
		h.m.registrations[regNoAddress].Inc()
		return
	}
	now := h.now()
	h.sweep(now)
	ok, err := h.regRate.Take(sha256.Sum256([]byte(bucketName)), now)
	if err != nil {
		h.internal(ctx, r, "register", err)
		return
	}
	if !ok {
		var buf [192]byte
		b := appendErrorHead(buf[:0], r, "too many registration attempts, try again later")
		b = append(b, `,"window":"minute","retryAfterSeconds":60}`...)
		retryAfterHeader(ctx, retryMinute)
		h.json(ctx, r, fasthttp.StatusTooManyRequests, b)
		h.m.registrations[regRateLimited].Inc()
		return
	}
	sc := h.getScratch()
	defer h.putScratch(sc)
	body, tooLarge, err := readBody(ctx, maxRegisterBody, sc.body)
	if tooLarge {
		h.fail(ctx, r, fasthttp.StatusRequestEntityTooLarge, "request body too large")
		h.m.registrations[regTooLarge].Inc()
		return
	}
	if errors.Is(err, errBodyWithheld) {
		// Unreachable: only a closed registration or an unusable proxy
		// header withholds a body this small, and both refused above.
		h.fail(ctx, r, fasthttp.StatusServiceUnavailable, "registration is temporarily unavailable")
		return
	}
	if err != nil {
		// Unparseable reads as {}, but a body that could not be read is
		// refused, as the reference refuses it: no key for a broken
		// request.
		h.fail(ctx, r, fasthttp.StatusBadRequest, errUnreadable)
		return
	}
	label := string(sc.p.parseLabel(body))

	key, err := newAPIKey()
	if err != nil {
		h.internal(ctx, r, "register", err)
		return
	}
	id := newID()
	rec := store.PushKey{
		ID: id, Hash: sha256.Sum256([]byte(key)), Label: label, Enabled: true,
		CreatedAt: now.UTC(), Source: store.PushSourceSelf, RegisteredIP: bucketName, Mount: h.provider,
	}
	old, err := h.store.RegisterKey(rec)
	if err != nil {
		h.internal(ctx, r, "register", err)
		return
	}
	h.m.registrations[regCreated].Inc()
	h.event(r, slog.LevelInfo, "key.created", id, slog.String("source", store.PushSourceSelf), slog.String("bucket", bucketName))
	if old != nil {
		h.event(r, slog.LevelInfo, "key.superseded", old.ID, slog.String("by", id), slog.String("bucket", bucketName))
	}

	b := sc.out[:0]
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","label":`...)
	b = appendJSONString(b, []byte(label))
	b = append(b, `,"key":"`...)
	b = append(b, key...)
	b = append(b, `","expiresAt":null}`...)
	h.json(ctx, r, fasthttp.StatusCreated, b)
}

// clientBucket is the address bucket of the caller: an IPv4 address as
// it is, an IPv6 address by its /64 (one subscriber usually holds a whole
// /64, so a finer bucket would let one household mint without limit). The
// address comes from the trusted proxy's header when one is configured,
// else from the connection.
func (h *Handler) clientBucket(ctx *fasthttp.RequestCtx) (string, bool) {
	if h.proxyHeader != "" {
		return proxyBucket(ctx.Request.Header.Peek(h.proxyHeader))
	}
	addr, ok := netip.AddrFromSlice(ctx.RemoteIP())
	if !ok {
		return "", false
	}
	return addressBucket(addr)
}

// addressBucket maps an address to its bucket name.
func addressBucket(a netip.Addr) (string, bool) {
	a = a.Unmap().WithZone("")
	switch {
	case !a.IsValid() || a.IsUnspecified():
		return "", false
	case a.Is4():
		return a.String(), true
	}
	p, err := a.Prefix(64)
	if err != nil {
		return "", false
	}
	return p.String(), true
}

// newAPIKey mints an API key: 32 random bytes as 64 lowercase hex
// characters. Only its SHA-256 is stored.
func newAPIKey() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("pushgw: api key: %w", err)
	}
	return hex.EncodeToString(raw[:]), nil
}

// newID is a fresh key id (a UUID v4).
func newID() string {
	var id [36]byte
	newUUID(&id)
	return string(id[:])
}
