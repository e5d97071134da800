// Package channelload drives a private channel relay (spec/private-channel.md) with
// real WebSockets and measures its forwarding path: frames per second and round-trip
// latency of phone → relay → computer → relay → phone.
//
// It speaks only the public protocol, so the same run can be pointed at our relay
// and at the baseline in bench/baseline/channel, and the two figures compared.
// The load generator itself is built to stay out of the way: the computer echoes
// each data message back byte for byte without decoding it, buffers are reused, and
// latencies go into fixed-size histograms rather than a slice per frame.
package channelload

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

const (
	// headerLen is the frame prefix "p<4 hex phone>:<16 hex counter>:".
	headerLen = 1 + 4 + 1 + 16 + 1
	// maxFrame is the protocol's largest phone frame.
	maxFrame = 70000
)

// Options describes one load run.
type Options struct {
	Origin    string      // relay origin, http://host:port or https://…; ws:// or wss:// is derived
	ClaimKey  string      // an unused claim key of the relay; the run consumes it
	Phones    int         // concurrent phones on the one computer (default 1)
	FrameSize int         // bytes per phone frame, headerLen to 70,000 (default 256)
	Frames    int         // total round trips to complete, spread over the phones
	Window    int         // frames in flight per phone (default 32)
	TLSConfig *tls.Config // optional, for https origins
}

// Result is what one run measured. Elapsed runs from the moment every phone is
// connected to the last echo, so claiming and dialling are not counted.
type Result struct {
	Frames       int
	Elapsed      time.Duration
	FramesPerSec float64
	P50, P99     time.Duration // round-trip latency, within about 1%
}

// Run claims o.ClaimKey with fresh tokens, connects the computer and o.Phones phones,
// and has the phones send o.Frames frames in total, each echoed back by the computer.
// Every echo is checked for content and order; any mismatch, refusal or broken
// socket ends the run with an error. ctx bounds the whole run, and every socket is
// closed before Run returns.
func Run(ctx context.Context, o Options) (Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Result{}, err
	}
	base, err := wsBase(o.Origin)
	if err != nil {
		return Result{}, err
	}
	ownerToken, phoneToken := NewToken(), NewToken()
	if err := Claim(ctx, o, ownerToken, phoneToken); err != nil {
		return Result{}, err
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dialer := &websocket.Dialer{
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: 10 * time.Second,
		TLSClientConfig:  o.TLSConfig,
		// Gorilla clients split a message into one frame per write buffer; real phones
		// send each message as one frame, so the buffer holds a whole (echoed) frame.
		WriteBufferSize: max(4096, 2*o.FrameSize+1024),
	}
	computer, err := dial(ctx, dialer, base+"/host", ownerToken)
	if err != nil {
		return Result{}, fmt.Errorf("channelload: computer: %w", err)
	}
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		if err := echo(computer); err != nil {
			cancel(fmt.Errorf("channelload: computer: %w", err))
		}
	}()
	phones := make([]*phone, o.Phones)
	defer func() {
		// Phones first, so the relay never sees a phone outlive its computer.
		for _, p := range phones {
			if p != nil {
				closeGracefully(p.ws)
			}
		}
		closeGracefully(computer)
		<-echoDone
	}()
	for i := range phones {
		ws, err := dial(ctx, dialer, base+"/botharness-device/channel", phoneToken)
		if err != nil {
			return Result{}, fmt.Errorf("channelload: phone %d: %w", i, err)
		}
		n := o.Frames / o.Phones
		if i < o.Frames%o.Phones {
			n++
		}
		phones[i] = newPhone(i, ws, n, o)
	}
	// Reads and writes do not watch ctx, so closing the sockets is what unblocks them.
	stop := context.AfterFunc(ctx, func() {
		computer.Close()
		for _, p := range phones {
			p.ws.Close()
		}
	})
	defer stop()

	// Each side of each phone reports its failure to cancel; the first one is the
	// run's error, and the sockets closing then stops everything else.
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range phones {
		wg.Go(func() {
			if err := p.send(ctx, start); err != nil {
				cancel(err)
			}
		})
		wg.Go(func() {
			if err := p.receive(start); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	var h histogram
	for _, p := range phones {
		h.merge(&p.latency)
	}
	if err := context.Cause(ctx); err != nil {
		return Result{}, fmt.Errorf("channelload: %d of %d frames done: %w", h.count(), o.Frames, err)
	}
	return Result{
		Frames:       o.Frames,
		Elapsed:      elapsed,
		FramesPerSec: float64(o.Frames) / elapsed.Seconds(),
		P50:          h.quantile(0.50),
		P99:          h.quantile(0.99),
	}, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Phones == 0 {
		o.Phones = 1
	}
	if o.FrameSize == 0 {
		o.FrameSize = 256
	}
	if o.Window == 0 {
		o.Window = 32
	}
	switch {
	case o.Frames < 1:
		return o, errors.New("channelload: Frames must be at least 1")
	case o.Phones < 1 || o.Phones > 0xffff:
		return o, fmt.Errorf("channelload: Phones %d out of range", o.Phones)
	case o.FrameSize < headerLen || o.FrameSize > maxFrame:
		return o, fmt.Errorf("channelload: FrameSize %d not within %d..%d", o.FrameSize, headerLen, maxFrame)
	case o.Window < 1:
		return o, fmt.Errorf("channelload: Window %d below 1", o.Window)
	}
	return o, nil
}

// wsBase turns the relay's http(s) origin into the ws(s) base of its sockets.
func wsBase(origin string) (string, error) {
	u, err := url.Parse(origin)
	if err != nil {
		return "", fmt.Errorf("channelload: origin: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("channelload: origin %q is not http or https", origin)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// Claim claims the computer of o.ClaimKey on the relay at o.Origin with
// the given tokens, as a computer's first start does.
func Claim(ctx context.Context, o Options, ownerToken, phoneToken string) error {
	body, _ := json.Marshal(map[string]string{"ownerToken": ownerToken, "phoneToken": phoneToken})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		strings.TrimSuffix(o.Origin, "/")+"/claim", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("channelload: claim: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+o.ClaimKey)
	req.Header.Set("Content-Type", "application/json")
	transport := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: o.TLSConfig}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return fmt.Errorf("channelload: claim: %w", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("channelload: claim: %s: %s", resp.Status, bytes.TrimSpace(answer))
	}
	return nil
}

// dial opens a socket with token as bearer, turning a refusal into a readable error.
func dial(ctx context.Context, d *websocket.Dialer, url, token string) (*websocket.Conn, error) {
	ws, resp, err := d.DialContext(ctx, url, http.Header{"Authorization": {"Bearer " + token}})
	if err != nil && resp != nil {
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%s refused: %s: %s", url, resp.Status, bytes.TrimSpace(answer))
	}
	return ws, err
}

func closeGracefully(ws *websocket.Conn) {
	_ = ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	_ = ws.Close()
}

// echo is the computer: it sends every data message back to the phone it came from.
// A relay→computer data message is already a valid computer→relay one for the same
// id, so echoing the bytes unchanged costs no decoding and no allocation, while the
// relay still has to parse and unescape it in full. It returns when the socket ends.
func echo(ws *websocket.Conn) error {
	var buf bytes.Buffer
	for {
		kind, r, err := ws.NextReader()
		if err != nil {
			return err
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return err
		}
		if kind != websocket.TextMessage {
			return errors.New("relay sent a binary frame")
		}
		typ, err := messageType(buf.Bytes())
		if err != nil {
			return fmt.Errorf("relay sent a malformed message %.80q: %w", buf.Bytes(), err)
		}
		if typ == "data" {
			if err := ws.WriteMessage(websocket.TextMessage, buf.Bytes()); err != nil {
				return err
			}
		}
	}
}

// messageType reads a control message's type. Relays normally write the type first
// and without spaces, which a prefix check recognises without reading the rest of a
// possibly 70 KB message; anything else is decoded.
func messageType(msg []byte) (string, error) {
	const prefix = `{"type":"`
	if len(msg) > len(prefix) && string(msg[:len(prefix)]) == prefix && msg[len(msg)-1] == '}' {
		rest := msg[len(prefix):]
		for _, typ := range [...]string{"data", "open", "close"} {
			if len(rest) > len(typ) && string(rest[:len(typ)]) == typ && rest[len(typ)] == '"' {
				return typ, nil
			}
		}
	}
	var m struct {
		Type string `json:"type"`
	}
	err := json.Unmarshal(msg, &m)
	return m.Type, err
}

// phone is one phone channel: a sender keeping up to window frames in flight and a
// receiver checking that the echoes come back intact and in order.
type phone struct {
	index  int
	ws     *websocket.Conn
	frames int
	size   int
	// inFlight holds a token per frame sent and not yet echoed.
	inFlight chan struct{}
	// sentAt[seq%window] is when frame seq was sent, in nanoseconds since the start.
	// It is atomic because the receiver learns of the send over the network, which
	// the race detector cannot see.
	sentAt  []atomic.Int64
	latency histogram
}

func newPhone(index int, ws *websocket.Conn, frames int, o Options) *phone {
	return &phone{
		index:    index,
		ws:       ws,
		frames:   frames,
		size:     o.FrameSize,
		inFlight: make(chan struct{}, o.Window),
		sentAt:   make([]atomic.Int64, o.Window),
	}
}

func (p *phone) send(ctx context.Context, start time.Time) error {
	frame := make([]byte, p.size)
	for seq := range p.frames {
		select {
		case p.inFlight <- struct{}{}:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		fillFrame(frame, p.index, seq)
		p.sentAt[seq%len(p.sentAt)].Store(int64(time.Since(start)))
		if err := p.ws.WriteMessage(websocket.TextMessage, frame); err != nil {
			return fmt.Errorf("phone %d: sending frame %d: %w", p.index, seq, err)
		}
	}
	return nil
}

func (p *phone) receive(start time.Time) error {
	var got bytes.Buffer
	want := make([]byte, p.size)
	for seq := range p.frames {
		kind, r, err := p.ws.NextReader()
		if err != nil {
			return fmt.Errorf("phone %d: waiting for echo of frame %d: %w", p.index, seq, err)
		}
		got.Reset()
		if _, err := got.ReadFrom(r); err != nil {
			return fmt.Errorf("phone %d: reading echo of frame %d: %w", p.index, seq, err)
		}
		now := time.Since(start)
		fillFrame(want, p.index, seq)
		switch {
		case kind != websocket.TextMessage:
			return fmt.Errorf("phone %d: echo of frame %d is not a text frame", p.index, seq)
		case !bytes.Equal(got.Bytes(), want):
			return fmt.Errorf("phone %d: echo of frame %d differs: got %d bytes %.60q…, want %d bytes %.60q…",
				p.index, seq, got.Len(), got.Bytes(), len(want), want)
		}
		p.latency.record(now - time.Duration(p.sentAt[seq%len(p.sentAt)].Load()))
		<-p.inFlight
	}
	return nil
}

// fillFrame writes frame seq of a phone: a header naming both, so that a frame
// delivered to the wrong phone or out of order is caught, then printable ASCII
// shifted by seq. The filler includes '"' and '\\', so every frame exercises the
// relay's JSON escaping as well.
func fillFrame(buf []byte, phone, seq int) {
	const digits = "0123456789abcdef"
	buf[0] = 'p'
	for i := range 4 {
		buf[4-i] = digits[(phone>>(4*i))&0xf]
	}
	buf[5] = ':'
	for i := range 16 {
		buf[21-i] = digits[(uint64(seq)>>(4*i))&0xf]
	}
	buf[22] = ':'
	for i := headerLen; i < len(buf); i++ {
		buf[i] = byte(' ' + (i+seq)%95)
	}
}

// NewToken is a fresh secret of the shape the protocol's keys and tokens
// have: 32 random bytes in hex.
func NewToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails since Go 1.24
	return hex.EncodeToString(b[:])
}
