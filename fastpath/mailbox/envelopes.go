package mailbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

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
func (h *Handler) put(ctx *fasthttp.RequestCtx, m store.Mailbox, r route, tok []byte, tokHash store.Hash, now int64) {
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
	wake := len(notify) > 0 && r.app.PushTopic != ""
	res, err := m.Put(context.Background(), r.dir, r.seq, env, wake, now)
	if err != nil {
		h.internal(ctx, err)
		return
	}
	switch res.Outcome {
	case store.PutCreated:
		h.m.envelopesStored.Inc()
		ctx.SetStatusCode(fasthttp.StatusCreated)
		if wake { // a retry (200) pushes nothing twice
			h.schedulePush(m, r, tok, tokHash, notify, res)
		}
	case store.PutRetry:
		ctx.SetStatusCode(fasthttp.StatusOK)
	case store.PutConflict, store.PutPruned:
		errConflict.answer(ctx)
	case store.PutFull:
		errMailboxFull.answer(ctx)
	case store.PutRateLimited:
		h.m.rateLimited.Inc()
		rateLimited(ctx, int64(res.RetryAfter))
	case store.PutNoMailbox: // erased since Open
		errNotFound.answer(ctx)
	default:
		h.internal(ctx, fmt.Errorf("mailbox: put decided %v", res.Outcome))
	}
}

// getOne is GET and HEAD of …/<dir>/<seq>.
func (h *Handler) getOne(ctx *fasthttp.RequestCtx, m store.Mailbox, r route, head bool) {
	var found bool
	var err error
	if head {
		found, err = m.HasEnvelope(context.Background(), r.dir, r.seq)
	} else {
		// Setting an empty body takes fasthttp's pooled body buffer,
		// so the envelope is copied into memory that is reused.
		ctx.Response.SetBody(nil)
		var body []byte
		body, found, err = m.AppendEnvelope(context.Background(), ctx.Response.Body()[:0], r.dir, r.seq)
		if found {
			ctx.Response.SetBody(body)
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

// head is HEAD …/<dir>: first, last and count.
func (h *Handler) head(ctx *fasthttp.RequestCtx, m store.Mailbox, r route) {
	st, err := m.State(context.Background(), r.dir)
	first, last, count := st.First, st.Last, st.Count
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
func (h *Handler) batch(ctx *fasthttp.RequestCtx, m store.Mailbox, r route) {
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
	err := m.Scan(context.Background(), r.dir, after, func(_ uint64, env []byte) bool {
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
func (h *Handler) prune(ctx *fasthttp.RequestCtx, m store.Mailbox, r route) {
	args := ctx.QueryArgs()
	through, ok := parseSeq(args.Peek("through"), true)
	if !args.Has("through") || !ok {
		errBadRequest.answer(ctx)
		return
	}
	if err := m.Prune(context.Background(), r.dir, through); err != nil {
		h.internal(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
