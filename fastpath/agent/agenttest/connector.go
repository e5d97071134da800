// Package agenttest is a test connector for the agent relay: it does what
// the real contenox connector (relaylink + librelay, v1.0.0) does on the
// wire, so that tests of the relay exercise the same bytes a real runtime
// sends and check the same things a real runtime checks.
//
//   - TLS 1.3 only, never plain text.
//   - The HTTP/1.1 upgrade written and read by net/http (Upgrade:
//     contenox-relay/1, Connection: Upgrade, Authorization: Bearer); 401 and
//     403 are ErrUnauthorized, fatal; the 101 must name contenox-relay/1.
//   - relay.hello with a fresh 32-byte nonce (padded standard base64), then
//     the welcome verified against the relay's published key with its own
//     implementation of the signed bytes (not the relay's), and the
//     version checked (at least 1, at most what was offered).
//   - Heartbeats: relay.heartbeat every HeartbeatEvery; a heartbeat not
//     acked within HeartbeatTimeout ends the link. The relay's own probes
//     are acked.
//
// Handshake stops after the welcome and leaves the connection to the
// caller without a goroutine (allocation tests drive it with prepared
// bytes); Dial also starts the connector's reader and heartbeats.
package agenttest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of the real connector.
const (
	DefaultHeartbeatEvery   = 15 * time.Second
	DefaultHeartbeatTimeout = 10 * time.Second
	dialTimeout             = 15 * time.Second
	upgradeProtocol         = "contenox-relay/1"
	signingDomain           = "contenox-relay/welcome/v1"
	nonceSize               = 32
	maxLine                 = 16 << 20
)

// Errors of the handshake. Like the real connector's, ErrUnauthorized,
// ErrBadSignature, ErrNoSignature and ErrVersion are fatal: redialing
// cannot fix them.
var (
	ErrUnauthorized     = errors.New("agenttest: relay refused the credential")
	ErrBadSignature     = errors.New("agenttest: welcome signature does not verify")
	ErrNoSignature      = errors.New("agenttest: welcome carries no signature")
	ErrVersion          = errors.New("agenttest: welcome protocol_version unusable")
	ErrHeartbeatTimeout = errors.New("agenttest: heartbeat not acked in time")
)

// RelayError is a relay.error answering the hello.
type RelayError struct {
	Code, Message string
	Raw           []byte
}

func (e *RelayError) Error() string { return "agenttest: relay error " + e.Code + ": " + e.Message }

// StatusError is an upgrade answered with a status other than 101, 401 or 403.
type StatusError struct{ Status int }

func (e *StatusError) Error() string { return fmt.Sprintf("agenttest: relay answered %d", e.Status) }

// Options configure a test connector.
type Options struct {
	// Addr is the relay's host:port; ServerName the TLS name to verify
	// ("localhost" by default) against RootCAs.
	Addr       string
	ServerName string
	RootCAs    *x509.CertPool
	// TLSMaxVersion, when set, caps the client's TLS version, for tests
	// that the relay refuses old TLS. The real connector never sets it.
	TLSMaxVersion uint16
	Path          string // "/v1/connect" by default

	Token    string
	Instance string
	// RelayKey is the published key the welcome is verified with (44
	// characters of padded base64). Empty: not verified.
	RelayKey string
	Agent    string // "agenttest/1" by default

	// ProtocolVersion is offered in the hello: 1 by default; set
	// OmitVersion to leave it out, or a negative value to send 0.
	ProtocolVersion int
	OmitVersion     bool
	// Nonce replaces the fresh random nonce; NoNonce sends none.
	Nonce   []byte
	NoNonce bool
	// HelloInstance replaces the instance named in the hello (payload and
	// envelope), to test the relay's check.
	HelloInstance string

	// HeartbeatEvery and HeartbeatTimeout as in the real connector
	// (15 s, 10 s by default); HeartbeatEvery < 0 sends none.
	HeartbeatEvery, HeartbeatTimeout time.Duration
	// IgnoreProbes leaves the relay's heartbeats unanswered.
	IgnoreProbes bool
}

// Welcome is what the relay answered the hello with.
type Welcome struct {
	ProtocolVersion int
	Relay           string
	Sig             []byte
	RetryAfter      int
	Raw             []byte
}

// Frame is one frame read from the link: its bytes and its envelope as
// librelay decodes it (encoding/json into the envelope struct).
type Frame struct {
	Raw      []byte `json:"-"`
	Type     string `json:"type"`
	Instance string `json:"instance,omitempty"`
	Session  string `json:"session,omitempty"`
	ID       string `json:"id,omitempty"`
	Re       string `json:"re,omitempty"`
	Seq      uint64 `json:"seq,omitempty"`
	Trace    string `json:"trace,omitempty"`
	// Payload is raw JSON.
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Link is a welcomed link without goroutines: Conn and R (which may hold
// bytes the relay sent after the 101 or the welcome) are the caller's.
type Link struct {
	Conn    *tls.Conn
	R       *bufio.Reader
	Welcome Welcome
	Opts    Options
}

// Handshake dials the relay, upgrades, sends the hello and verifies the
// welcome.
func Handshake(ctx context.Context, o Options) (*Link, error) {
	if o.ServerName == "" {
		o.ServerName = "localhost"
	}
	if o.Path == "" {
		o.Path = "/v1/connect"
	}
	if o.Agent == "" {
		o.Agent = "agenttest/1"
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: o.ServerName, RootCAs: o.RootCAs}
	if o.TLSMaxVersion != 0 {
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, o.TLSMaxVersion
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: dialTimeout}, Config: cfg}
	nc, err := d.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return nil, err
	}
	conn := nc.(*tls.Conn)
	l, err := handshake(ctx, conn, o)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return l, nil
}

func handshake(ctx context.Context, conn *tls.Conn, o Options) (*Link, error) {
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	u := &url.URL{Scheme: "https", Host: o.Addr, Path: o.Path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Upgrade", upgradeProtocol)
	req.Header.Set("Connection", "Upgrade")
	if o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+o.Token)
	}
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("agenttest: send upgrade: %w", err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("agenttest: read upgrade answer: %w", err)
	}
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusSwitchingProtocols:
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, fmt.Errorf("%w: %s", ErrUnauthorized, resp.Status)
	default:
		return nil, &StatusError{Status: resp.StatusCode}
	}
	if !strings.EqualFold(strings.TrimSpace(resp.Header.Get("Upgrade")), upgradeProtocol) {
		return nil, fmt.Errorf("agenttest: relay upgraded to %q", resp.Header.Get("Upgrade"))
	}

	nonce := o.Nonce
	if nonce == nil && !o.NoNonce {
		nonce = make([]byte, nonceSize)
		_, _ = rand.Read(nonce)
	}
	if o.NoNonce {
		nonce = nil
	}
	inst := o.Instance
	if o.HelloInstance != "" {
		inst = o.HelloInstance
	}
	offered := o.ProtocolVersion
	if offered == 0 {
		offered = 1
	}
	if offered < 0 {
		offered = 0
	}
	payload := map[string]any{"instance": inst, "agent": o.Agent}
	if !o.OmitVersion {
		payload["protocol_version"] = offered
	}
	if nonce != nil {
		payload["nonce"] = nonce // []byte: padded standard base64, as librelay's Hello
	}
	hello, err := EncodeFrame(Frame{Type: "relay.hello", Instance: inst, ID: "hello"}, payload)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(hello, '\n')); err != nil {
		return nil, fmt.Errorf("agenttest: send hello: %w", err)
	}
	raw, err := readLine(br)
	if err != nil {
		return nil, fmt.Errorf("agenttest: read welcome: %w", err)
	}
	f, err := DecodeFrame(raw)
	if err != nil {
		return nil, fmt.Errorf("agenttest: welcome: %w", err)
	}
	if f.Type == "relay.error" {
		var p struct{ Code, Message string }
		_ = json.Unmarshal(f.Payload, &p)
		return nil, &RelayError{Code: p.Code, Message: p.Message, Raw: raw}
	}
	if f.Type != "relay.welcome" || f.Re != "hello" {
		return nil, fmt.Errorf("agenttest: want the welcome, got %q", raw)
	}
	var wp struct {
		ProtocolVersion int    `json:"protocol_version"`
		Relay           string `json:"relay"`
		Sig             []byte `json:"sig"`
		RetryAfter      int    `json:"retry_after"`
	}
	if err := json.Unmarshal(f.Payload, &wp); err != nil {
		return nil, fmt.Errorf("agenttest: welcome payload: %w", err)
	}
	w := Welcome{ProtocolVersion: wp.ProtocolVersion, Relay: wp.Relay, Sig: wp.Sig, RetryAfter: wp.RetryAfter, Raw: raw}
	if w.ProtocolVersion < 1 || w.ProtocolVersion > max(offered, 0) {
		return nil, fmt.Errorf("%w: %d after offering %d", ErrVersion, w.ProtocolVersion, offered)
	}
	if o.RelayKey != "" && nonce != nil {
		if err := Verify(o.RelayKey, nonce, w.ProtocolVersion, inst, w.Sig); err != nil {
			return nil, err
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return &Link{Conn: conn, R: br, Welcome: w, Opts: o}, nil
}

// Verify checks a welcome signature the way librelay.VerifyWelcome does,
// with the signed bytes built here independently of the relay's code.
func Verify(publishedKey string, nonce []byte, version int, instance string, sig []byte) error {
	if len(publishedKey) != 44 {
		return fmt.Errorf("agenttest: published key %q is not 44 characters", publishedKey)
	}
	pub, err := base64.StdEncoding.DecodeString(publishedKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("agenttest: published key: %v", err)
	}
	if len(sig) == 0 {
		return ErrNoSignature
	}
	input := signingDomain + "\x00" + base64.RawURLEncoding.EncodeToString(nonce) + "\x00" +
		strconv.Itoa(version) + "\x00" + instance
	if !ed25519.Verify(pub, []byte(input), sig) {
		return ErrBadSignature
	}
	return nil
}

// EncodeFrame encodes f with payload (any value, or json.RawMessage) as
// librelay does: encoding/json, envelope fields in their order, empty
// ones left out. The line feed is not included.
func EncodeFrame(f Frame, payload any) ([]byte, error) {
	if payload != nil {
		p, err := json.Marshal(payload)
		if err != nil {
			return nil, err
		}
		f.Payload = p
	}
	return json.Marshal(f)
}

// DecodeFrame decodes one line as librelay does.
func DecodeFrame(line []byte) (Frame, error) {
	var f Frame
	if err := json.Unmarshal(line, &f); err != nil {
		return Frame{}, err
	}
	f.Raw = line
	return f, nil
}

// readLine reads one line without its line feed (and one carriage
// return), skipping blank ones, up to the 16 MiB line limit.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxLine {
			return nil, errors.New("agenttest: line longer than 16 MiB")
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
		if len(bytes.TrimSpace(line)) == 0 {
			line = line[:0]
			continue
		}
		return line, nil
	}
}

// Connector is a running link: a reader goroutine delivering frames,
// heartbeats and answers to the relay's probes, as the real connector runs.
type Connector struct {
	l      *Link
	frames chan Frame
	done   chan struct{}

	wmu sync.Mutex // one line at a time on the connection

	mu       sync.Mutex
	err      error
	hbWanted string    // id of the outstanding heartbeat
	hbSent   time.Time // when it was sent
	probes   int       // relay probes received
}

// Dial is Handshake followed by Start.
func Dial(ctx context.Context, o Options) (*Connector, error) {
	l, err := Handshake(ctx, o)
	if err != nil {
		return nil, err
	}
	return l.Start(), nil
}

// Start runs the link's reader and heartbeats.
func (l *Link) Start() *Connector {
	c := &Connector{l: l, frames: make(chan Frame, 4096), done: make(chan struct{})}
	go c.readLoop()
	if l.Opts.HeartbeatEvery >= 0 {
		go c.heartbeatLoop()
	}
	return c
}

// Welcome is the welcome the relay sent.
func (c *Connector) Welcome() Welcome { return c.l.Welcome }

// Send writes one line (a line feed is added).
func (c *Connector) Send(line []byte) error {
	return c.SendRaw(append(append([]byte(nil), line...), '\n'))
}

// SendRaw writes b exactly as given.
func (c *Connector) SendRaw(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.l.Conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, err := c.l.Conn.Write(b)
	return err
}

// SendFrame encodes and sends a frame.
func (c *Connector) SendFrame(f Frame, payload any) error {
	b, err := EncodeFrame(f, payload)
	if err != nil {
		return err
	}
	return c.Send(b)
}

// Next returns the next frame that is not a heartbeat exchange, or an
// error when the link ended or timeout passed.
func (c *Connector) Next(timeout time.Duration) (Frame, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case f, ok := <-c.frames:
		if !ok {
			return Frame{}, c.Err()
		}
		return f, nil
	case <-t.C:
		return Frame{}, errors.New("agenttest: no frame in time")
	}
}

// Probes is how many relay heartbeats the connector has received.
func (c *Connector) Probes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.probes
}

// Done is closed when the link has ended.
func (c *Connector) Done() <-chan struct{} { return c.done }

// Err is why the link ended (io.EOF for a relay that closed it).
func (c *Connector) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the link.
func (c *Connector) Close() error {
	err := c.l.Conn.Close()
	<-c.done
	return err
}

func (c *Connector) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	_ = c.l.Conn.Close()
}

func (c *Connector) readLoop() {
	defer close(c.done)
	defer close(c.frames)
	for {
		raw, err := readLine(c.l.R)
		if err != nil {
			c.fail(err)
			return
		}
		f, err := DecodeFrame(raw)
		if err != nil {
			continue // librelay's reader skips what it cannot decode
		}
		switch {
		case f.Type == "relay.heartbeat" && f.ID != "":
			c.mu.Lock()
			c.probes++
			c.mu.Unlock()
			if !c.l.Opts.IgnoreProbes {
				ack, _ := EncodeFrame(Frame{Type: "relay.ack", Instance: c.l.Opts.Instance, Re: f.ID}, nil)
				_ = c.Send(ack)
			}
			continue
		case f.Type == "relay.ack" && strings.HasPrefix(f.Re, "hb-"):
			c.mu.Lock()
			if f.Re == c.hbWanted {
				c.hbWanted = ""
			}
			c.mu.Unlock()
			continue
		}
		c.frames <- f
	}
}

func (c *Connector) heartbeatLoop() {
	every, timeout := c.l.Opts.HeartbeatEvery, c.l.Opts.HeartbeatTimeout
	if every == 0 {
		every = DefaultHeartbeatEvery
	}
	if timeout == 0 {
		timeout = DefaultHeartbeatTimeout
	}
	tick := time.NewTicker(min(every, timeout) / 4)
	defer tick.Stop()
	n := 0
	last := time.Now()
	for {
		select {
		case <-c.done:
			return
		case now := <-tick.C:
			c.mu.Lock()
			wanted, sent := c.hbWanted, c.hbSent
			c.mu.Unlock()
			if wanted != "" {
				if now.Sub(sent) >= timeout {
					c.fail(ErrHeartbeatTimeout)
					return
				}
				continue
			}
			if now.Sub(last) < every {
				continue
			}
			n++
			id := "hb-" + strconv.Itoa(n)
			c.mu.Lock()
			c.hbWanted, c.hbSent = id, now
			c.mu.Unlock()
			last = now
			b, _ := EncodeFrame(Frame{Type: "relay.heartbeat", Instance: c.l.Opts.Instance, ID: id}, nil)
			if err := c.Send(b); err != nil {
				c.fail(err)
				return
			}
		}
	}
}
