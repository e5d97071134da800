// Package apns sends notifications through Apple's push notification service
// (the HTTP/2 provider API) with token-based authentication: an ES256 JWT
// signed by the operator's .p8 auth key.
//
// The provider token is minted with sideshow/apns2's token package. The
// request itself is written here rather than with apns2.Client.Push because
// that method re-encodes the payload through encoding/json (compacting it
// and escaping <, > and &), so the bytes Apple received would not be the
// bytes the caller built, and because the retry on a refused provider token
// needs to know which token a request carried.
package apns

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/token"

	"edgerelay/push"
	"edgerelay/push/internal/providerhttp"
)

// Environments. A device token belongs to one of them: debug builds of an
// app get development tokens, App Store and TestFlight builds production ones.
const (
	EnvironmentProduction  = "production"
	EnvironmentDevelopment = "development"
)

// Push types and priorities used by the relay.
const (
	PushTypeAlert      = "alert"
	PushTypeBackground = "background"

	PriorityHigh = 10 // deliver now; required for alerts the user sees
	PriorityLow  = 5  // let the device pick the moment; required for background pushes
)

const (
	// tokenMaxAge is how long one provider token is reused. Apple refuses a
	// token older than an hour and answers TooManyProviderTokenUpdates when
	// a provider renews more often than every 20 minutes; 29 minutes is what
	// the reference push gateway uses and sits safely between the two.
	tokenMaxAge = 29 * time.Minute

	// forcedRefreshGap stops a key Apple keeps refusing (a wrong key id, a
	// revoked key) from turning every send into a token mint plus a second
	// request: after one forced renewal, the next one waits this long.
	forcedRefreshGap = time.Minute

	// maxAnswer bounds how much of an error answer is read. Apple's are a
	// few dozen bytes of JSON.
	maxAnswer = 4 << 10
)

// Config is what the module needs from the operator. Without a readable
// key the module is not loaded (New fails).
type Config struct {
	// KeyFile is the path of the .p8 auth key downloaded from the Apple
	// Developer account (a PEM "PRIVATE KEY" block holding a PKCS#8 P-256
	// key).
	KeyFile string
	// KeyID is the 10-character identifier of that key (the JWT's kid).
	KeyID string
	// TeamID is the Apple Developer team identifier (the JWT's iss).
	TeamID string
	// Environment selects Apple's host for notifications that name none:
	// "production" (also the default when empty) or "development";
	// "sandbox" is accepted as a synonym of development. Case and
	// surrounding spaces are ignored.
	Environment string
	// BaseURL replaces Apple's host for every environment, for tests and
	// for operators who route through their own front; "" means Apple's.
	// It must be https: APNs speaks only HTTP/2 over TLS.
	BaseURL string
	// RootCAs replaces the system roots for in-process tests. Leave it nil
	// in production; the system roots honour SSL_CERT_FILE.
	RootCAs *x509.CertPool
	// Timeout bounds each request to APNs (connect, TLS, answer). Zero
	// means 10 s.
	Timeout time.Duration
}

// Notification is one push to one device.
type Notification struct {
	// DeviceToken is the device token as the app reported it (hex). It is
	// path-escaped into the request URL, so any string is safe to pass.
	DeviceToken string
	// Topic is the app's bundle id (apns-topic). Required with token
	// authentication.
	Topic string
	// PushType is the apns-push-type header, PushTypeAlert when empty.
	PushType string
	// Priority is the apns-priority header (PriorityHigh or PriorityLow);
	// zero omits it, which Apple reads as 10.
	Priority int
	// Payload is the JSON body, sent byte for byte.
	Payload []byte
	// Expiration is when Apple may stop trying to deliver (apns-expiration);
	// the zero time omits the header.
	Expiration time.Time
	// Environment of this device's token: "production", "development" (or
	// "sandbox"), or "" for the client's configured environment. It selects
	// the host only when Config.BaseURL is empty.
	Environment string
}

// Result is Apple's answer to one notification.
type Result struct {
	// Status is the HTTP status of the final attempt; 200 means accepted.
	Status int
	// Reason is Apple's reason string for a refusal ("BadDeviceToken",
	// "Unregistered", ...), empty on success.
	Reason string
	// APNsID is the apns-id Apple assigned to the notification.
	APNsID string
	// Unregistered reports that the device token is dead for this topic:
	// 410 (the app was removed) or 400 BadDeviceToken (the token is not a
	// token of this environment). The mailbox deletes the registration on
	// it. The push gateway's rule is narrower, 410 only, because a
	// BadDeviceToken there usually means the gateway's own environment is
	// wrong; it tests Status == http.StatusGone instead.
	Unregistered bool
	// Retryable reports a refusal that may succeed later unchanged: too
	// many requests, or Apple's servers failing or shutting down.
	Retryable bool
}

// Client sends notifications for one auth key. It is safe for concurrent
// use and keeps one HTTP/2 connection per host open between sends.
type Client struct {
	hc         *http.Client
	token      *providerToken
	env        string // default environment
	production string // base URL for production device tokens
	sandbox    string // base URL for development device tokens
}

// New loads the auth key and returns a client. It fails when the key file
// is missing or is not a PKCS#8 P-256 key, when the key id or team id is
// empty, or when the environment or base URL is invalid; the caller then
// treats the module as not loaded. New makes no network request.
func New(cfg Config) (*Client, error) {
	if cfg.KeyID == "" || cfg.TeamID == "" {
		return nil, errors.New("apns: key id and team id are required")
	}
	env, err := parseEnvironment(cfg.Environment)
	if err != nil {
		return nil, err
	}
	key, err := token.AuthKeyFromFile(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("apns: auth key %q: %w", cfg.KeyFile, err)
	}
	c := &Client{
		hc:         providerhttp.NewClient(cfg.RootCAs, true, cfg.Timeout),
		token:      &providerToken{signer: &token.Token{AuthKey: key, KeyID: cfg.KeyID, TeamID: cfg.TeamID}},
		env:        env,
		production: apns2.HostProduction,
		sandbox:    apns2.HostDevelopment,
	}
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("apns: base URL %q is not an https URL", cfg.BaseURL)
		}
		base := strings.TrimRight(cfg.BaseURL, "/")
		c.production, c.sandbox = base, base
	}
	// Mint the first token now: a key that cannot sign fails here, not on
	// the first push.
	if _, err := c.token.current(); err != nil {
		return nil, err
	}
	return c, nil
}

// Close releases idle connections. Sends after Close open new ones.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Send delivers one notification. An error means no answer was read from
// Apple; it wraps [push.ErrNotSent] when the request never left the
// process. Any answer from Apple, including a refusal, is a Result with a
// nil error.
//
// When Apple refuses the provider token (403 ExpiredProviderToken or
// InvalidProviderToken), Send mints a fresh token and tries once more, so
// that a token Apple stopped accepting costs one failed request instead of
// every request until it ages out. (A token minted that way and refused
// again within a minute is not replaced again: the key itself is wrong.)
func (c *Client) Send(ctx context.Context, n Notification) (Result, error) {
	target, err := c.target(&n)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", push.ErrNotSent, err)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("%w: apns: %w", push.ErrNotSent, err)
	}
	b, err := c.token.current()
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", push.ErrNotSent, err)
	}
	res, sent, err := c.post(ctx, target, b, &n)
	if err != nil {
		if !sent {
			err = fmt.Errorf("%w: %w", push.ErrNotSent, err)
		}
		return Result{}, err
	}
	if res.Status != http.StatusForbidden ||
		(res.Reason != apns2.ReasonExpiredProviderToken && res.Reason != apns2.ReasonInvalidProviderToken) {
		return res, nil
	}
	fresh, err := c.token.replace(b)
	if err != nil {
		return Result{}, err // Apple was contacted: not ErrNotSent
	}
	if fresh == nil {
		return res, nil
	}
	// The first attempt reached Apple, so a failure now is never "not sent".
	res, _, err = c.post(ctx, target, fresh, &n)
	return res, err
}

// target validates n and returns the request URL.
func (c *Client) target(n *Notification) (string, error) {
	switch {
	case n.DeviceToken == "":
		return "", errors.New("apns: empty device token")
	case n.Topic == "":
		return "", errors.New("apns: empty topic")
	case len(n.Payload) == 0:
		return "", errors.New("apns: empty payload")
	}
	env := c.env
	if n.Environment != "" {
		var err error
		if env, err = parseEnvironment(n.Environment); err != nil {
			return "", err
		}
	}
	base := c.production
	if env == EnvironmentDevelopment {
		base = c.sandbox
	}
	return base + "/3/device/" + url.PathEscape(n.DeviceToken), nil
}

// post makes one attempt. sent reports whether the request may have
// reached Apple.
func (c *Client) post(ctx context.Context, target string, b *bearer, n *Notification) (res Result, sent bool, err error) {
	ctx, tracker := providerhttp.Track(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(n.Payload))
	if err != nil {
		return Result{}, false, fmt.Errorf("apns: %w", err)
	}
	// Canonical keys set directly: HTTP/2 lower-cases them on the wire.
	h := req.Header
	h["Authorization"] = b.header
	h["Content-Type"] = []string{"application/json"}
	h["Apns-Topic"] = []string{n.Topic}
	pushType := n.PushType
	if pushType == "" {
		pushType = PushTypeAlert
	}
	h["Apns-Push-Type"] = []string{pushType}
	if n.Priority != 0 {
		h["Apns-Priority"] = []string{strconv.Itoa(n.Priority)}
	}
	if !n.Expiration.IsZero() {
		h["Apns-Expiration"] = []string{strconv.FormatInt(n.Expiration.Unix(), 10)}
	}

	resp, err := c.hc.Do(req)
	if err != nil {
		return Result{}, tracker.Wrote(), fmt.Errorf("apns: %w", err)
	}
	res.Status = resp.StatusCode
	res.APNsID = resp.Header.Get("Apns-Id")
	body, err := providerhttp.ReadBody(resp.Body, maxAnswer)
	if err != nil {
		return Result{}, true, fmt.Errorf("apns: reading answer: %w", err)
	}
	if res.Status != http.StatusOK && len(body) > 0 {
		var answer struct {
			Reason string `json:"reason"`
		}
		// A body that is not Apple's JSON (a proxy's error page) leaves
		// Reason empty; the status still classifies the answer.
		_ = json.Unmarshal(body, &answer)
		res.Reason = answer.Reason
	}
	res.Unregistered = res.Status == http.StatusGone || res.Reason == apns2.ReasonBadDeviceToken
	switch res.Status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		res.Retryable = true
	}
	return res, true, nil
}

// parseEnvironment maps the accepted spellings to the two environments.
func parseEnvironment(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", EnvironmentProduction:
		return EnvironmentProduction, nil
	case EnvironmentDevelopment, "sandbox":
		return EnvironmentDevelopment, nil
	}
	return "", fmt.Errorf("apns: unknown environment %q (want production or development)", s)
}

// providerToken hands out the current provider token without locking and
// renews it under a lock when it ages out or Apple refuses it.
type providerToken struct {
	signer *token.Token // its embedded mutex serializes minting
	cur    atomic.Pointer[bearer]
}

// bearer is one minted provider token.
type bearer struct {
	header []string  // the authorization header value: "bearer <jwt>"
	issued time.Time // its iat
	forced bool      // minted because Apple refused the previous one
}

// current returns the token to send with, minting one when there is none
// or the current one is older than tokenMaxAge.
func (p *providerToken) current() (*bearer, error) {
	if b := p.cur.Load(); b != nil && time.Since(b.issued) < tokenMaxAge {
		return b, nil
	}
	p.signer.Lock()
	defer p.signer.Unlock()
	if b := p.cur.Load(); b != nil && time.Since(b.issued) < tokenMaxAge {
		return b, nil // another sender renewed it meanwhile
	}
	return p.mint(false)
}

// replace returns the token to retry with after Apple refused refused:
// a newer token another sender already minted, or a fresh one. It returns
// nil (do not retry) when refused is itself a forced renewal younger than
// forcedRefreshGap, that is, when renewing evidently does not help.
func (p *providerToken) replace(refused *bearer) (*bearer, error) {
	p.signer.Lock()
	defer p.signer.Unlock()
	if b := p.cur.Load(); b != refused {
		return b, nil
	}
	if refused.forced && time.Since(refused.issued) < forcedRefreshGap {
		return nil, nil
	}
	return p.mint(true)
}

// mint signs a new token; the caller holds p.signer's lock.
func (p *providerToken) mint(forced bool) (*bearer, error) {
	if _, err := p.signer.Generate(); err != nil {
		return nil, fmt.Errorf("apns: signing provider token: %w", err)
	}
	b := &bearer{
		header: []string{"bearer " + p.signer.Bearer},
		issued: time.Unix(p.signer.IssuedAt, 0),
		forced: forced,
	}
	p.cur.Store(b)
	return b, nil
}
