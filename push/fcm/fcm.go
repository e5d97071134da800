// Package fcm sends messages through Firebase Cloud Messaging's HTTP v1 API,
// authenticated with an OAuth2 access token obtained from a Google service
// account (the JWT-bearer grant of golang.org/x/oauth2/google).
package fcm

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"golang.org/x/oauth2/jwt"

	"edgerelay/push"
	"edgerelay/push/internal/providerhttp"
)

// Scope is the OAuth2 scope FCM HTTP v1 requires.
const Scope = "https://www.googleapis.com/auth/firebase.messaging"

// DefaultBaseURL is FCM's endpoint.
const DefaultBaseURL = "https://fcm.googleapis.com"

const (
	// tokenEarly is how long before its expiry an access token is replaced:
	// a token that expires while a request is in flight would cost a 401
	// and a retry. The reference gateway caches to a minute before expiry.
	tokenEarly = time.Minute

	// forcedRefreshGap: after one token fetched because FCM answered 401,
	// the next such fetch waits this long.
	forcedRefreshGap = time.Minute

	// maxAnswer bounds how much of an answer is read. FCM's are well under
	// a kilobyte.
	maxAnswer = 16 << 10
)

// Config is what the module needs from the operator. Without a usable
// service account the module is not loaded (New fails).
type Config struct {
	// CredentialsFile is the path of the service-account JSON key
	// downloaded from the Firebase console. Its project_id names the FCM
	// project, its token_uri the token endpoint (Google's when absent),
	// its client_email and private_key sign the token request.
	CredentialsFile string
	// BaseURL replaces https://fcm.googleapis.com, for tests; "" means FCM.
	BaseURL string
	// RootCAs replaces the system roots (for both FCM and the token
	// endpoint) in in-process tests. Leave it nil in production; the
	// system roots honour SSL_CERT_FILE.
	RootCAs *x509.CertPool
	// Timeout bounds each request (to FCM or to the token endpoint). Zero
	// means 10 s.
	Timeout time.Duration
}

// Result is FCM's answer to one message.
type Result struct {
	// Status is the HTTP status of the final attempt; 200 means accepted.
	Status int
	// Name is the message id FCM assigned ("projects/p/messages/123"),
	// set on success.
	Name string
	// ErrorCode is the FcmError errorCode of a refusal (UNREGISTERED,
	// INVALID_ARGUMENT, QUOTA_EXCEEDED, UNAVAILABLE, ...) or, when the
	// answer has none, its error.status (UNAUTHENTICATED, NOT_FOUND, ...).
	ErrorCode string
	// Message is FCM's human-readable error.message, for the operator's
	// log only (clip it; never show it to a caller).
	Message string
	// Unregistered reports a dead registration token: 404 with an
	// FcmError detail UNREGISTERED. Both the mailbox and the push gateway
	// delete the device on it, and on nothing else.
	Unregistered bool
	// Retryable reports a refusal that may succeed later unchanged: quota
	// exceeded (429) or FCM failing (500, 502, 503, 504).
	Retryable bool
	// RetryAfter is FCM's Retry-After, when it sent one.
	RetryAfter time.Duration
}

// Client sends messages for one service account. It is safe for concurrent
// use; it keeps its connection open and its access token cached between
// sends.
type Client struct {
	hc       *http.Client
	endpoint string // <base>/v1/projects/<project>/messages:send
	project  string
	tokens   *tokenCache
}

// New reads the service account and returns a client. It fails when the
// file is missing, is not a service-account key, lacks a project id or a
// client email, or holds no RSA private key; the caller then treats the
// module as not loaded. New makes no network request.
func New(cfg Config) (*Client, error) {
	raw, err := os.ReadFile(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("fcm: credentials: %w", err)
	}
	var account struct {
		ProjectID string `json:"project_id"`
	}
	if err := json.Unmarshal(raw, &account); err != nil {
		return nil, fmt.Errorf("fcm: credentials %q: %w", cfg.CredentialsFile, err)
	}
	if account.ProjectID == "" {
		return nil, fmt.Errorf("fcm: credentials %q: no project_id", cfg.CredentialsFile)
	}
	jc, err := google.JWTConfigFromJSON(raw, Scope)
	if err != nil {
		return nil, fmt.Errorf("fcm: credentials %q: %w", cfg.CredentialsFile, err)
	}
	if jc.Email == "" {
		return nil, fmt.Errorf("fcm: credentials %q: no client_email", cfg.CredentialsFile)
	}
	// x/oauth2 parses the key only when it first fetches a token; parse it
	// now so that a broken key keeps the module from loading.
	if err := checkRSAKey(jc.PrivateKey); err != nil {
		return nil, fmt.Errorf("fcm: credentials %q: %w", cfg.CredentialsFile, err)
	}

	base := DefaultBaseURL
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("fcm: base URL %q is not an http(s) URL", cfg.BaseURL)
		}
		base = strings.TrimRight(cfg.BaseURL, "/")
	}
	hc := providerhttp.NewClient(cfg.RootCAs, false, cfg.Timeout)
	return &Client{
		hc:       hc,
		endpoint: base + "/v1/projects/" + url.PathEscape(account.ProjectID) + "/messages:send",
		project:  account.ProjectID,
		tokens: &tokenCache{
			config: jc,
			// x/oauth2 finds its HTTP client in the context it is given.
			fetchCtx: context.WithValue(context.Background(), oauth2.HTTPClient, hc),
			slot:     make(chan struct{}, 1),
		},
	}, nil
}

// ProjectID is the Firebase project the client sends for.
func (c *Client) ProjectID() string { return c.project }

// Close releases idle connections. Sends after Close open new ones.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Send posts msg, the complete request body ({"message":{...}}), byte for
// byte. An error means no answer was read from FCM; it wraps
// [push.ErrNotSent] when FCM was never contacted (including when no access
// token could be obtained). Any answer from FCM, including a refusal, is a
// Result with a nil error.
//
// When FCM answers 401, Send drops the cached access token, fetches a new
// one and tries once more: a token revoked or expired early would otherwise
// fail every send until its nominal expiry. (A token fetched that way and
// refused again within a minute is not replaced again.)
func (c *Client) Send(ctx context.Context, msg []byte) (Result, error) {
	if len(msg) == 0 {
		return Result{}, fmt.Errorf("%w: fcm: empty message", push.ErrNotSent)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("%w: fcm: %w", push.ErrNotSent, err)
	}
	tok, err := c.tokens.get(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", push.ErrNotSent, err)
	}
	res, sent, err := c.post(ctx, tok, msg)
	if err != nil {
		if !sent {
			err = fmt.Errorf("%w: %w", push.ErrNotSent, err)
		}
		return Result{}, err
	}
	if res.Status != http.StatusUnauthorized {
		return res, nil
	}
	fresh, err := c.tokens.renew(ctx, tok)
	if err != nil {
		return Result{}, err // FCM was contacted: not ErrNotSent
	}
	if fresh == nil {
		return res, nil
	}
	// The first attempt reached FCM, so a failure now is never "not sent".
	res, _, err = c.post(ctx, fresh, msg)
	return res, err
}

// post makes one attempt. sent reports whether the request may have
// reached FCM.
func (c *Client) post(ctx context.Context, tok *accessToken, msg []byte) (res Result, sent bool, err error) {
	ctx, tracker := providerhttp.Track(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(msg))
	if err != nil {
		return Result{}, false, fmt.Errorf("fcm: %w", err)
	}
	req.Header["Authorization"] = []string{"Bearer " + tok.AccessToken}
	req.Header["Content-Type"] = []string{"application/json; charset=utf-8"}
	resp, err := c.hc.Do(req)
	if err != nil {
		return Result{}, tracker.Wrote(), fmt.Errorf("fcm: %w", err)
	}
	res.Status = resp.StatusCode
	res.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
	body, err := providerhttp.ReadBody(resp.Body, maxAnswer)
	if err != nil {
		return Result{}, true, fmt.Errorf("fcm: reading answer: %w", err)
	}
	parseAnswer(&res, body)
	return res, true, nil
}

// parseAnswer fills in what the body says. A body that is not FCM's JSON
// (a proxy's error page) leaves the fields empty; the status still
// classifies the answer.
func parseAnswer(res *Result, body []byte) {
	var answer struct {
		Name  string `json:"name"`
		Error struct {
			Message string `json:"message"`
			Status  string `json:"status"`
			Details []struct {
				Type      string `json:"@type"`
				ErrorCode string `json:"errorCode"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &answer)
	if res.Status == http.StatusOK {
		res.Name = answer.Name
		return
	}
	res.Message = answer.Error.Message
	res.ErrorCode = answer.Error.Status
	first := true
	for _, d := range answer.Error.Details {
		if d.ErrorCode == "" {
			continue
		}
		if first {
			res.ErrorCode, first = d.ErrorCode, false
		}
		if d.ErrorCode == "UNREGISTERED" && res.Status == http.StatusNotFound {
			res.Unregistered = true
		}
	}
	switch res.Status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		res.Retryable = true
	}
}

// parseRetryAfter reads delay-seconds or an HTTP date; zero when absent or
// unreadable.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// checkRSAKey reports whether pemKey holds an RSA private key the way
// x/oauth2 will read it (PKCS#8, or PKCS#1 for old keys).
func checkRSAKey(pemKey []byte) error {
	block, _ := pem.Decode(pemKey)
	if block == nil {
		return errors.New("private_key is not PEM")
	}
	if _, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return nil
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return fmt.Errorf("private_key: %w", err)
	}
	if _, ok := key.(*rsa.PrivateKey); !ok {
		return errors.New("private_key is not an RSA key")
	}
	return nil
}

// tokenCache holds the current access token. Reads are lock-free; at most
// one fetch runs at a time and senders arriving meanwhile wait for its
// result (or for their context).
type tokenCache struct {
	config   *jwt.Config
	fetchCtx context.Context // carries the HTTP client; never cancelled
	slot     chan struct{}   // a one-slot semaphore around fetching
	cur      atomic.Pointer[accessToken]
}

// accessToken is one fetched token.
type accessToken struct {
	*oauth2.Token
	fetched time.Time
	forced  bool // fetched because FCM refused the previous one
}

func usable(t *accessToken) bool {
	return t != nil && (t.Expiry.IsZero() || time.Until(t.Expiry) > tokenEarly)
}

// get returns a usable access token, fetching one if needed.
func (tc *tokenCache) get(ctx context.Context) (*accessToken, error) {
	if t := tc.cur.Load(); usable(t) {
		return t, nil
	}
	if err := tc.lock(ctx); err != nil {
		return nil, err
	}
	defer tc.unlock()
	if t := tc.cur.Load(); usable(t) {
		return t, nil // fetched by the sender we waited for
	}
	return tc.fetch(false)
}

// renew returns the token to retry with after FCM refused refused: a newer
// one another sender already fetched, or a fresh one. It returns nil (do
// not retry) when refused was itself fetched after a refusal less than
// forcedRefreshGap ago: a credential FCM keeps refusing (the API disabled
// for the project, say) must not turn every send into a token fetch and a
// second request.
func (tc *tokenCache) renew(ctx context.Context, refused *accessToken) (*accessToken, error) {
	if err := tc.lock(ctx); err != nil {
		return nil, err
	}
	defer tc.unlock()
	if t := tc.cur.Load(); t != refused && usable(t) {
		return t, nil
	}
	if refused.forced && time.Since(refused.fetched) < forcedRefreshGap {
		return nil, nil
	}
	return tc.fetch(true)
}

func (tc *tokenCache) lock(ctx context.Context) error {
	select {
	case tc.slot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fcm: waiting for access token: %w", ctx.Err())
	}
}

func (tc *tokenCache) unlock() { <-tc.slot }

// fetch gets a new token from the token endpoint; the caller holds the
// slot. A new TokenSource each time: x/oauth2's sources cache, and this
// cache is the one that knows when to drop a token. The request is bounded
// by the HTTP client's timeout.
func (tc *tokenCache) fetch(forced bool) (*accessToken, error) {
	t, err := tc.config.TokenSource(tc.fetchCtx).Token()
	if err != nil {
		return nil, fmt.Errorf("fcm: fetching access token: %w", err)
	}
	at := &accessToken{Token: t, fetched: time.Now(), forced: forced}
	tc.cur.Store(at)
	return at, nil
}
