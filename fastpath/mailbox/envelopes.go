package mailbox

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/envcache"
	"edgerelay/store"
)

// The relay's own response headers, written in canonical form so that
// they are set with SetCanonical: SetBytesKV would copy and normalize the
// name on every request (a tenth of a HEAD's handler time).
var (
	headerFirst = []byte("X-Relay-First")
	headerLast  = []byte("X-Relay-Last")
	headerCount = []byte("X-Relay-Count")
	headerMore  = []byte("X-Relay-More")
	octetStream = []byte("application/octet-stream")
	batchType   = []byte("application/vnd.zerobyte.batch")
)

// put is PUT …/<dir>/<seq>: store one envelope durably.
func (h *Handler) put(ctx *fasthttp.RequestCtx, m *mailbox, r route, tok []byte, now int64) {
	env := ctx.Request.Body()
	// The outside checks come first: a refused envelope spends nothing.
	switch {
	case len(env) > h.cfg.MaxEnvelope:
		errTooLarge.answer(ctx)
		return
	case len(env) < minEnvelopeSize || env[0] != 0x01 || binary.BigEndian.Uint64(env[1:9]) != r.seq:
		errBadRequest.answer(ctx)
		return
	}
	notify := ctx.Request.Header.Peek("X-Relay-Notify")
	if len(notify) > 0 && string(notify) != "alert" && string(notify) != "silent" {
		errBadRequest.answer(ctx)
		return
	}
	if !h.take(ctx, h.limits.envelopes, m.key, now) {
		return
	}
	for {
		status, wait := h.reserve(ctx, m, r, env, now)
		if wait != nil {
			<-wait // the same sequence is being written: see how it ends
			continue
		}
		if status != 0 {
			ctx.SetStatusCode(status)
		}
		if status == fasthttp.StatusCreated { // a retry (200) pushes nothing twice
			h.schedulePush(m, r, tok, notify, now)
		}
		return
	}
}

// reserve decides a PUT under the mailbox lock and, when it is a new
// envelope, writes it with the lock released so that concurrent writers
// share one sync. It returns the success status (0 when it answered an
// error itself), or a channel to wait on when the same sequence is in
// flight.
func (h *Handler) reserve(ctx *fasthttp.RequestCtx, m *mailbox, r route, env []byte, now int64) (int, chan struct{}) {
	m.mu.Lock()
	m.lastUse = now
	if !m.exists || h.expired(m, now) { // erased since authorize
		m.mu.Unlock()
		errNotFound.answer(ctx)
		return 0, nil
	}
	d, err := m.direction(h.cfg.Store, r.dir)
	if err != nil {
		m.mu.Unlock()
		h.internal(ctx, err)
		return 0, nil
	}
	if ch, busy := d.settled(r.seq); busy {
		m.mu.Unlock()
		return 0, ch
	}
	if r.seq <= d.Pruned {
		m.mu.Unlock()
		errConflict.answer(ctx)
		return 0, nil
	}
	var same, exists bool
	// Above the last stored sequence nothing can be stored (a write of it
	// in flight was handled above): the usual, appending, case needs no
	// lookup.
	if d.Count > 0 && r.seq <= d.Last {
		same, exists = h.envs.Equal(envcache.Key{Epoch: m.epoch, Dir: r.dir, Seq: r.seq}, env)
		if !exists {
			exists, err = h.cfg.Store.Envelope(m.name, r.dir, r.seq, func(stored []byte) { same = bytes.Equal(stored, env) })
		}
		if err != nil {
			m.mu.Unlock()
			h.internal(ctx, err)
			return 0, nil
		}
	}
	if exists {
		m.mu.Unlock()
		if !same {
			errConflict.answer(ctx)
			return 0, nil
		}
		return fasthttp.StatusOK, nil // a retry: stored already, nothing to wake
	}
	if d.Count+d.reservedCount+1 > h.cfg.MaxStored || d.Bytes+d.reservedBytes+len(env) > h.cfg.MaxStoredBytes {
		m.mu.Unlock()
		errMailboxFull.answer(ctx)
		return 0, nil
	}
	if d.inflight == nil {
		d.inflight = make(map[uint64]chan struct{})
	}
	d.inflight[r.seq] = nil
	d.reservedCount++
	d.reservedBytes += len(env)
	m.rec.LastActive = now
	var touch *store.MailboxRecord
	prev := m.persisted
	if now-m.persisted >= h.touchEvery() {
		touch = &store.MailboxRecord{Token: m.rec.Token, LastActive: now}
		m.persisted = now
	}
	m.mu.Unlock()

	// The envelope is not put in the envelope cache: a copy per write
	// cost 2 µs of server CPU per PUT at 64 writers (its fresh cache
	// lines evict the commit path's), and most envelopes reach their
	// reader through a watch socket or a batch, never a GET of one.
	err = h.cfg.Store.Put(m.name, r.dir, r.seq, env, touch, prev)

	m.mu.Lock()
	done := d.inflight[r.seq]
	delete(d.inflight, r.seq)
	d.reservedCount--
	d.reservedBytes -= len(env)
	if err == nil {
		if d.Count == 0 || r.seq < d.First {
			d.First = r.seq
		}
		if r.seq > d.Last {
			d.Last = r.seq
		}
		d.Count++
		d.Bytes += len(env)
		for _, w := range d.watchers {
			w.deliver(r.seq, env)
		}
	}
	m.mu.Unlock()
	if done != nil {
		close(done)
	}
	if err != nil {
		h.internal(ctx, err)
		return 0, nil
	}
	h.m.envelopesStored.Inc()
	return fasthttp.StatusCreated, nil
}

// getOne is GET and HEAD of …/<dir>/<seq>. What the direction's state in
// memory settles is answered without a lookup: a sequence outside the
// stored range (or pruned) is 404, and one inside a range with no gap is
// stored. The rest is read from the envelope cache, then the store.
func (h *Handler) getOne(ctx *fasthttp.RequestCtx, m *mailbox, r route, head bool) {
	m.mu.Lock()
	d, err := m.direction(h.cfg.Store, r.dir)
	var inRange, noGap bool
	if err == nil {
		inRange = d.Count > 0 && r.seq >= d.First && r.seq <= d.Last && r.seq > d.Pruned
		noGap = uint64(d.Count) == d.Last-d.First+1
	}
	key := envcache.Key{Epoch: m.epoch, Dir: r.dir, Seq: r.seq}
	m.mu.Unlock()
	found := inRange && head && noGap
	if err == nil && inRange && !found {
		if head {
			if found = h.envs.Has(key); !found {
				found, err = h.cfg.Store.Envelope(m.name, r.dir, r.seq, nil)
			}
		} else {
			// Setting an empty body takes fasthttp's pooled body buffer,
			// so the envelope is copied into memory that is reused.
			ctx.Response.SetBody(nil)
			var body []byte
			if body, found = h.envs.Append(ctx.Response.Body()[:0], key); !found {
				body, found, err = h.cfg.Store.AppendEnvelope(body, m.name, r.dir, r.seq)
				if found {
					h.envs.Put(key, body)
				}
			}
			if found {
				ctx.Response.SetBody(body)
			}
		}
	}
	switch {
	case err != nil:
		h.internal(ctx, err)
	case !found:
		errNotFound.answer(ctx)
	default:
		ctx.Response.Header.SetContentTypeBytes(octetStream)
		ctx.SetStatusCode(fasthttp.StatusOK)
	}
}

// head is HEAD …/<dir>: first, last and count from memory.
func (h *Handler) head(ctx *fasthttp.RequestCtx, m *mailbox, r route) {
	m.mu.Lock()
	d, err := m.direction(h.cfg.Store, r.dir)
	var first, last uint64
	var count int
	if err == nil {
		first, last, count = d.First, d.Last, d.Count
	}
	m.mu.Unlock()
	if err != nil {
		h.internal(ctx, err)
		return
	}
	if count == 0 {
		first, last = 0, 0
	}
	var b [20]byte
	hdr := &ctx.Response.Header
	hdr.SetCanonical(headerFirst, strconv.AppendUint(b[:0], first, 10))
	hdr.SetCanonical(headerLast, strconv.AppendUint(b[:0], last, 10))
	hdr.SetCanonical(headerCount, strconv.AppendInt(b[:0], int64(count), 10))
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// batch is GET …/<dir>?after=&limit=.
func (h *Handler) batch(ctx *fasthttp.RequestCtx, m *mailbox, r route) {
	args := ctx.QueryArgs()
	after, limit := uint64(0), defaultBatch
	if v := args.Peek("after"); args.Has("after") {
		var ok bool
		if after, ok = parseSeq(v, true); !ok {
			errBadRequest.answer(ctx)
			return
		}
	}
	if v := args.Peek("limit"); args.Has("limit") {
		n, ok := parseSeq(v, false)
		if !ok || n > maxBatchLimit {
			errBadRequest.answer(ctx)
			return
		}
		limit = int(n)
	}
	body := ctx.Response.Body()[:0]
	n, more := 0, false
	err := h.cfg.Store.Scan(m.name, r.dir, after, func(_ uint64, env []byte) bool {
		if n == limit || (n > 0 && len(body)+4+len(env) > maxBatchBytes) {
			more = true
			return false
		}
		body = binary.BigEndian.AppendUint32(body, uint32(len(env)))
		body = append(body, env...)
		n++
		return true
	})
	if err != nil {
		h.internal(ctx, err)
		return
	}
	ctx.Response.SetBodyRaw(body)
	ctx.Response.Header.SetContentTypeBytes(batchType)
	if more {
		ctx.Response.Header.SetCanonical(headerMore, []byte("1"))
	} else {
		ctx.Response.Header.SetCanonical(headerMore, []byte("0"))
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// prune is DELETE …/<dir>?through=<seq>.
func (h *Handler) prune(ctx *fasthttp.RequestCtx, m *mailbox, r route) {
	args := ctx.QueryArgs()
	through, ok := parseSeq(args.Peek("through"), true)
	if !args.Has("through") || !ok {
		errBadRequest.answer(ctx)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A write still syncing could land below the new mark after it.
	h.waitInflight(m)
	d, err := m.direction(h.cfg.Store, r.dir)
	if err != nil {
		h.internal(ctx, err)
		return
	}
	if through > d.Pruned {
		if err := h.cfg.Store.Prune(m.name, r.dir, through); err != nil {
			h.internal(ctx, err)
			return
		}
		// Recount what is left: pruning is rare and bounded by MaxStored.
		st, err := h.cfg.Store.State(m.name, r.dir)
		if err != nil {
			h.internal(ctx, err)
			return
		}
		d.DirectionState = st
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
