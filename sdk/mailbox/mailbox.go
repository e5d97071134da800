// Package mailbox is a client of the mailbox relay's core endpoints
// (spec/mailbox.md, sections Core endpoints and Watch): claim and erase a
// mailbox, store, fetch, list and prune sealed envelopes, and watch a
// direction over a WebSocket.
//
// It moves envelopes as opaque bytes. Sealing and opening them, and dropping
// replays, is edgerelay/sdk/link's job; the bearer is Link.AccessToken.
//
// The client checks what it needs to build a request (a valid direction) and
// what it needs to read an answer (status, headers, batch framing), and
// nothing else: sequences and envelopes are sent as given, because the relay
// is the one that checks them, and tests of the relay use this client to send
// what it must refuse.
//
// Every answer outside the success statuses of its request becomes an *Error
// (use errors.As), wrapped with the operation that got it.
package mailbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/sdk/link"
)

// BatchContentType is the media type of a batch answer: each envelope as a
// 4-byte big-endian length, then its bytes.
const BatchContentType = "application/vnd.zerobyte.batch"

// Values of X-Relay-Notify, the writer's request for a push on Put.
const (
	NotifyNone   = ""
	NotifyAlert  = "alert"
	NotifySilent = "silent"
)

// maxBody bounds what the client reads of any answer, so a misbehaving relay
// (or something posing as one) cannot make it buffer without limit. A batch
// is at most 4 MiB but always holds one envelope, whose limit is the relay's
// RELAY_MAX_ENVELOPE (64 KiB by default, configurable); 64 MiB leaves room
// for any sensible configuration.
const maxBody = 64 << 20

// maxErrorBody bounds what the client reads of an error answer, which is a
// short JSON object.
const maxErrorBody = 4 << 10

// Client talks to one relay for one app. The zero values of HTTP and Dialer
// mean http.DefaultClient and websocket.DefaultDialer. A Client is safe for
// concurrent use as long as its fields are not changed.
type Client struct {
	// BaseURL is the relay's http(s)://host:port; a path prefix is kept.
	// Watch derives ws(s) from it.
	BaseURL string
	// App is the app name, the first path segment after /v1/.
	App string
	// HTTP sends the HTTP requests.
	HTTP *http.Client
	// Dialer opens watch sockets. Its Subprotocols field is ignored: Watch
	// offers the relay's own.
	Dialer *websocket.Dialer
}

// Mailbox returns a handle on mailbox id (the link id) with the bearer token
// (Link.AccessToken). It makes no request.
func (c *Client) Mailbox(id, token string) *Mailbox {
	return &Mailbox{c: c, ID: id, Token: token}
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// Mailbox is one mailbox on the relay, addressed with one bearer. It is safe
// for concurrent use.
type Mailbox struct {
	c *Client
	// ID is the mailbox id: the link id.
	ID string
	// Token is the bearer, sent in Authorization (never in a URL).
	Token string
}

// Claim claims the mailbox for the token: created is true when the relay made
// the mailbox (201), false when it was already this token's (204, which
// restarts its idle timer: an app whose link can stay quiet for longer than
// the relay's RELAY_IDLE claims again now and then). A mailbox that another
// token holds answers an *Error with Code "taken".
func (m *Mailbox) Claim(ctx context.Context) (created bool, err error) {
	resp, err := m.do(ctx, http.MethodPut, m.path(""), nil, nil, nil)
	if err != nil {
		return false, fmt.Errorf("mailbox: claim: %w", err)
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusCreated:
		return true, nil
	case http.StatusNoContent:
		return false, nil
	}
	return false, fmt.Errorf("mailbox: claim: %w", answerError(resp))
}

// Erase removes the mailbox: every envelope of both directions, the push
// registrations and the marks. The relay closes its watch sockets with 1000.
func (m *Mailbox) Erase(ctx context.Context) error {
	resp, err := m.do(ctx, http.MethodDelete, m.path(""), nil, nil, nil)
	if err != nil {
		return fmt.Errorf("mailbox: erase: %w", err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("mailbox: erase: %w", answerError(resp))
	}
	return nil
}

// Put stores envelope under seq in direction dir. stored is true when the
// relay stored it (201, synced to disk) and false when it already held the
// same bytes under seq (200: a retry, which the relay does not push again),
// so a writer that does not know whether a Put arrived simply repeats it.
// notify is X-Relay-Notify: NotifyNone, NotifyAlert or NotifySilent (other
// values are sent as given, and the relay answers 400).
func (m *Mailbox) Put(ctx context.Context, dir link.Direction, seq uint64, envelope []byte, notify string) (stored bool, err error) {
	if err := checkDir(dir); err != nil {
		return false, fmt.Errorf("mailbox: put: %w", err)
	}
	op := fmt.Sprintf("put %s/%d", dir, seq)
	resp, err := m.do(ctx, http.MethodPut, m.path(seqPath(dir, seq)), nil, envelope, func(h http.Header) {
		h.Set("Content-Type", "application/octet-stream")
		if notify != NotifyNone {
			h.Set("X-Relay-Notify", notify)
		}
	})
	if err != nil {
		return false, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusCreated:
		return true, nil
	case http.StatusOK:
		return false, nil
	}
	return false, fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
}

// Get fetches the envelope stored under seq. One that is not stored answers
// an *Error with Status 404.
func (m *Mailbox) Get(ctx context.Context, dir link.Direction, seq uint64) ([]byte, error) {
	if err := checkDir(dir); err != nil {
		return nil, fmt.Errorf("mailbox: get: %w", err)
	}
	op := fmt.Sprintf("get %s/%d", dir, seq)
	resp, err := m.do(ctx, http.MethodGet, m.path(seqPath(dir, seq)), nil, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
	}
	body, err := readBody(resp)
	if err != nil {
		return nil, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	return body, nil
}

// Batch fetches, in ascending order, the envelopes stored above sequence
// after: at most limit of them (limit <= 0 leaves it to the relay: 100; it
// caps any limit at 1,000) and at most 4 MiB. more says that the relay holds
// more: fetch again with after = the last envelope's sequence.
func (m *Mailbox) Batch(ctx context.Context, dir link.Direction, after uint64, limit int) (envs [][]byte, more bool, err error) {
	if err := checkDir(dir); err != nil {
		return nil, false, fmt.Errorf("mailbox: batch: %w", err)
	}
	op := fmt.Sprintf("batch %s after %d", dir, after)
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	resp, err := m.do(ctx, http.MethodGet, m.path(string(dir)), q, nil, nil)
	if err != nil {
		return nil, false, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
	}
	if ct := resp.Header.Get("Content-Type"); ct != BatchContentType {
		return nil, false, fmt.Errorf("mailbox: %s: Content-Type %q, want %s", op, ct, BatchContentType)
	}
	switch v := resp.Header.Get("X-Relay-More"); v {
	case "1":
		more = true
	case "0":
	default:
		return nil, false, fmt.Errorf("mailbox: %s: X-Relay-More %q, want 0 or 1", op, v)
	}
	body, err := readBody(resp)
	if err != nil {
		return nil, false, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	envs, err = decodeBatch(body)
	if err != nil {
		return nil, false, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	return envs, more, nil
}

// Head reports what direction dir holds: the first and last stored sequence
// (0 when it holds none) and how many envelopes.
func (m *Mailbox) Head(ctx context.Context, dir link.Direction) (first, last uint64, count int, err error) {
	if err := checkDir(dir); err != nil {
		return 0, 0, 0, fmt.Errorf("mailbox: head: %w", err)
	}
	op := fmt.Sprintf("head %s", dir)
	resp, err := m.do(ctx, http.MethodHead, m.path(string(dir)), nil, nil, nil)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return 0, 0, 0, fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
	}
	header := func(name string) (uint64, error) {
		v := resp.Header.Get(name)
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("mailbox: %s: %s %q is not a decimal number", op, name, v)
		}
		return n, nil
	}
	if first, err = header("X-Relay-First"); err != nil {
		return 0, 0, 0, err
	}
	if last, err = header("X-Relay-Last"); err != nil {
		return 0, 0, 0, err
	}
	n, err := header("X-Relay-Count")
	if err != nil {
		return 0, 0, 0, err
	}
	if n > uint64(int(^uint(0)>>1)) {
		return 0, 0, 0, fmt.Errorf("mailbox: %s: X-Relay-Count %d out of range", op, n)
	}
	return first, last, int(n), nil
}

// HeadSeq reports whether the envelope seq is stored. The relay answers a
// HEAD without a body, so a 404 for a missing mailbox looks like one for a
// missing envelope: both are false.
func (m *Mailbox) HeadSeq(ctx context.Context, dir link.Direction, seq uint64) (bool, error) {
	if err := checkDir(dir); err != nil {
		return false, fmt.Errorf("mailbox: head: %w", err)
	}
	op := fmt.Sprintf("head %s/%d", dir, seq)
	resp, err := m.do(ctx, http.MethodHead, m.path(seqPath(dir, seq)), nil, nil, nil)
	if err != nil {
		return false, fmt.Errorf("mailbox: %s: %w", op, err)
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
}

// Prune deletes every envelope of dir at or below through, and the relay
// remembers through as the pruned mark: a later Put at or below it answers
// 409 conflict. The reader prunes what it has accepted, so that the relay
// stores only what is still undelivered.
func (m *Mailbox) Prune(ctx context.Context, dir link.Direction, through uint64) error {
	if err := checkDir(dir); err != nil {
		return fmt.Errorf("mailbox: prune: %w", err)
	}
	op := fmt.Sprintf("prune %s through %d", dir, through)
	q := url.Values{"through": {strconv.FormatUint(through, 10)}}
	resp, err := m.do(ctx, http.MethodDelete, m.path(string(dir)), q, nil, nil)
	if err != nil {
		return fmt.Errorf("mailbox: %s: %w", op, err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("mailbox: %s: %w", op, answerError(resp))
	}
	return nil
}

// path is the mailbox's path below BaseURL, with suffix ("p2c", "p2c/7")
// after it when not empty.
func (m *Mailbox) path(suffix string) string {
	p := "/v1/" + url.PathEscape(m.c.App) + "/mailbox/" + url.PathEscape(m.ID)
	if suffix != "" {
		p += "/" + suffix
	}
	return p
}

func seqPath(dir link.Direction, seq uint64) string {
	return string(dir) + "/" + strconv.FormatUint(seq, 10)
}

func checkDir(dir link.Direction) error {
	if !dir.Valid() {
		return fmt.Errorf("invalid direction %q (want p2c or c2p)", string(dir))
	}
	return nil
}

// do sends one request with the bearer. body is sent as is (nil: none);
// header, when not nil, adds headers.
func (m *Mailbox) do(ctx context.Context, method, path string, query url.Values, body []byte, header func(http.Header)) (*http.Response, error) {
	u := strings.TrimSuffix(m.c.BaseURL, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+m.Token)
	if header != nil {
		header(req.Header)
	}
	return m.c.httpClient().Do(req)
}

// readBody reads a success body, at most maxBody bytes.
func readBody(resp *http.Response) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("answer over %d bytes", maxBody)
	}
	return body, nil
}

// drain reads what is left of a body (a little) and closes it, so that the
// connection can carry the next request.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	_ = resp.Body.Close()
}

// Error is an answer of the relay other than the request's success: the
// status, the code of its JSON body {"error":"<code>","status":<n>} and, for
// 429, Retry-After. Code is empty when the body did not say (a HEAD answer
// has none; a proxy may answer something else).
type Error struct {
	Status     int
	Code       string
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := "relay answered " + strconv.Itoa(e.Status)
	if e.Code != "" {
		s += " " + e.Code
	} else if t := http.StatusText(e.Status); t != "" {
		s += " (" + t + ")"
	}
	if e.RetryAfter > 0 {
		s += ", retry after " + e.RetryAfter.String()
	}
	return s
}

// answerError decodes an answer that is not the request's success.
func answerError(resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	if resp.Body == nil {
		return e
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil || len(body) == 0 {
		return e
	}
	var answer struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &answer) == nil {
		e.Code = answer.Error
	}
	return e
}

// CloseCode is the WebSocket close code the relay ended a watch with (1000
// when the mailbox was erased, 1013 when the reader fell too far behind), and
// false when err is no close frame. It looks through wrapping, which
// websocket.IsCloseError does not.
func CloseCode(err error) (int, bool) {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code, true
	}
	return 0, false
}
