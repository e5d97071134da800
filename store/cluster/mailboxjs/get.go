package mailboxjs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"edgerelay/store/cluster"
)

// msg is one stored message as the layout reads it.
type msg struct {
	subject string
	seq     uint64 // stream sequence
	hdr     nats.Header
	data    []byte
}

// clientSeq is an envelope's sequence, from its own bytes (0 for a
// message that is no envelope).
func (m *msg) clientSeq() uint64 { return envelopeSeq(m.data) }

func envelopeSeq(env []byte) uint64 {
	if len(env) < 9 {
		return 0
	}
	return binary.BigEndian.Uint64(env[1:9])
}

var errNoMsg = errors.New("mailboxjs: no such message")

type getReq struct {
	Seq      uint64 `json:"seq,omitempty"`
	LastFor  string `json:"last_by_subj,omitempty"`
	NextFor  string `json:"next_by_subj,omitempty"`
	Batch    int    `json:"batch,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// leaderGet reads one message through the stream leader
// ($JS.API.STREAM.MSG.GET): read-after-write, unlike Direct Get (ADR-31).
// errNoMsg when none matches.
func (s *Store) leaderGet(ctx context.Context, stream string, req getReq) (*msg, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	body, _ := json.Marshal(req)
	resp, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, cluster.Fail("read "+stream, err)
	}
	var r struct {
		Error *struct {
			Code    int    `json:"code"`
			ErrCode int    `json:"err_code"`
			Desc    string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Hdrs    []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, cluster.Fail("read "+stream, fmt.Errorf("decode: %w", err))
	}
	if r.Error != nil {
		if r.Error.ErrCode == 10037 { // message not found
			return nil, errNoMsg
		}
		return nil, cluster.Fail("read "+stream, fmt.Errorf("%d %d %s", r.Error.Code, r.Error.ErrCode, r.Error.Desc))
	}
	if r.Message == nil {
		return nil, cluster.Fail("read "+stream, errors.New("empty answer"))
	}
	m := &msg{subject: r.Message.Subject, seq: r.Message.Seq, data: r.Message.Data}
	if len(r.Message.Hdrs) > 0 {
		if m.hdr, err = decodeHeaders(r.Message.Hdrs); err != nil {
			return nil, cluster.Fail("read "+stream, err)
		}
	} else {
		m.hdr = nats.Header{}
	}
	return m, nil
}

// decodeHeaders parses a raw "NATS/1.0\r\nKey: Value\r\n...\r\n\r\n"
// header block (nats.go exports no parser for one).
func decodeHeaders(raw []byte) (nats.Header, error) {
	lines := strings.Split(string(raw), "\r\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "NATS/1.0") {
		return nil, errors.New("mailboxjs: malformed header block")
	}
	h := nats.Header{}
	for _, l := range lines[1:] {
		if l == "" {
			continue
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return nil, errors.New("mailboxjs: malformed header line")
		}
		h.Add(k, strings.TrimSpace(v))
	}
	return h, nil
}

// directGet reads one message through Direct Get (any replica answers:
// may be a little behind the leader). errNoMsg when none matches.
func (s *Store) directGet(ctx context.Context, stream string, req getReq) (*msg, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	body, _ := json.Marshal(req)
	resp, err := s.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, body)
	if err != nil {
		return nil, cluster.Fail("read "+stream, err)
	}
	return directMsg(stream, resp)
}

func directMsg(stream string, resp *nats.Msg) (*msg, error) {
	switch resp.Header.Get("Status") {
	case "":
	case "404":
		return nil, errNoMsg
	default:
		return nil, cluster.Fail("read "+stream, fmt.Errorf("direct get: %s %s", resp.Header.Get("Status"), resp.Header.Get("Description")))
	}
	seq, err := strconv.ParseUint(resp.Header.Get(hdrStreamSq), 10, 64)
	if err != nil {
		return nil, cluster.Fail("read "+stream, fmt.Errorf("direct get: no sequence"))
	}
	return &msg{subject: resp.Header.Get("Nats-Subject"), seq: seq, hdr: resp.Header, data: resp.Data}, nil
}

// directBatch reads up to batch messages on filter from stream sequence
// from (up to upTo, 0 for the end), at most about maxBytes, in stream
// order, calling fn for each until it returns false. It returns the stream
// sequence of the last message read (0: none). Any replica may answer, so
// the batch can end short of the leader's last message. The batch is read
// whole (bounded by maxBytes and one message) before fn sees any of it, so
// a slow fn (a watcher's socket) cannot stall the read past its deadline.
func (s *Store) directBatch(ctx context.Context, stream, filter string, from, upTo uint64, batch, maxBytes int, fn func(*msg) bool) (uint64, error) {
	msgs, err := s.readBatch(ctx, stream, filter, from, upTo, batch, maxBytes)
	var last uint64
	for _, m := range msgs {
		last = m.seq
		if !fn(m) {
			break
		}
	}
	return last, err
}

func (s *Store) readBatch(ctx context.Context, stream, filter string, from, upTo uint64, batch, maxBytes int) ([]*msg, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	inbox := nats.NewInbox()
	// A channel just big enough for the batch and its end marker:
	// SubscribeSync would allocate one of 64k entries (512 KiB) per read.
	ch := make(chan *nats.Msg, batch+2)
	sub, err := s.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, cluster.Fail("read "+stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(getReq{Seq: from, NextFor: filter, Batch: batch, MaxBytes: maxBytes})
	if err := s.nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, cluster.Fail("read "+stream, err)
	}
	var msgs []*msg
	for {
		var resp *nats.Msg
		select {
		case resp = <-ch:
		case <-ctx.Done():
			return msgs, cluster.Fail("read "+stream, ctx.Err())
		}
		switch resp.Header.Get("Status") {
		case "204", "404": // end of batch; nothing at or after from
			return msgs, nil
		}
		m, err := directMsg(stream, resp)
		if err != nil {
			return msgs, err
		}
		if upTo > 0 && m.seq > upTo {
			// up_to_seq bounds only multi_last requests (server
			// getDirectRequest): a batch is cut here. The rest of it
			// goes to the inbox given up.
			return msgs, nil
		}
		msgs = append(msgs, m)
	}
}
