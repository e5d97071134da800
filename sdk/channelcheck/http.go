package channelcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The protocol names GET /health must announce.
const (
	protocolV1 = "botharness-private-v1"
	protocolV2 = "botharness-private-v2"
)

// maxBody bounds what is read of any answer; the contract's answers are tiny.
const maxBody = 64 << 10

// answer is one HTTP answer, read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request and reads its answer. It notes an answer without
// Cache-Control: no-store for the final check rather than failing here, so
// that a missing header does not hide everything after it.
func (c *checker) call(ctx context.Context, method, path, bearer string, body []byte) (answer, error) {
	u := *c.httpURL
	u.Path += path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	c.noteNoStore(method+" "+path, resp)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// noteNoStore remembers what answered without Cache-Control: no-store.
func (c *checker) noteNoStore(what string, resp *http.Response) {
	if hasNoStore(resp.Header) {
		return
	}
	if s := fmt.Sprintf("%s (HTTP %d)", what, resp.StatusCode); !slices.Contains(c.noStore, s) {
		c.noStore = append(c.noStore, s)
	}
}

func hasNoStore(h http.Header) bool {
	for _, v := range h.Values("Cache-Control") {
		for d := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(d), "no-store") {
				return true
			}
		}
	}
	return false
}

// decode requires status and decodes the JSON body into v.
func (a answer) decode(status int, v any) error {
	if a.status != status {
		return fmt.Errorf("HTTP %d %s, want %d", a.status, quote(a.body), status)
	}
	if err := json.Unmarshal(a.body, v); err != nil {
		return fmt.Errorf("HTTP %d body %s is not the expected JSON: %w", a.status, quote(a.body), err)
	}
	return nil
}

// decodeError requires status and the contract's {"error":"<message>"} body.
func (a answer) decodeError(status int) error {
	var e struct {
		Error *string `json:"error"`
	}
	if err := a.decode(status, &e); err != nil {
		return err
	}
	if e.Error == nil {
		return fmt.Errorf("HTTP %d body %s has no \"error\" string", a.status, quote(a.body))
	}
	return nil
}

// checkHealth requires GET /health to announce both protocol versions.
// The body is compared as JSON, not as bytes: key order and spacing are the
// relay's business.
func (c *checker) checkHealth(ctx context.Context) error {
	ans, err := c.call(ctx, http.MethodGet, "/health", "", nil)
	if err != nil {
		return err
	}
	var h struct {
		Protocol  *string  `json:"protocol"`
		Protocols []string `json:"protocols"`
	}
	if err := ans.decode(http.StatusOK, &h); err != nil {
		return fmt.Errorf("GET /health: %w", err)
	}
	var problems []string
	if h.Protocol == nil || *h.Protocol != protocolV1 {
		problems = append(problems, fmt.Sprintf("protocol is not %q", protocolV1))
	}
	for _, p := range []string{protocolV1, protocolV2} {
		if !slices.Contains(h.Protocols, p) {
			problems = append(problems, fmt.Sprintf("protocols lacks %q", p))
		}
	}
	if !hasNoStore(ans.header) {
		problems = append(problems, fmt.Sprintf("Cache-Control is %q, want no-store", ans.header.Get("Cache-Control")))
	}
	if len(problems) > 0 {
		return fmt.Errorf("GET /health answered %s: %s", quote(ans.body), strings.Join(problems, "; "))
	}
	return nil
}

// awaitHealth waits for a restarted relay to answer GET /health correctly.
func (c *checker) awaitHealth(ctx context.Context) error {
	return poll(ctx, func() error { return c.checkHealth(ctx) })
}

// claim claims p's key with fresh tokens and remembers them and the host
// name the relay answers with.
func (c *checker) claim(ctx context.Context, p *party) error {
	p.owner, p.phoneToken = token(), token()
	ans, err := c.postClaim(ctx, p.key, p.owner, p.phoneToken)
	if err != nil {
		return err
	}
	var r struct {
		Claimed *bool   `json:"claimed"`
		Host    *string `json:"host"`
	}
	if ans.status == http.StatusConflict {
		return fmt.Errorf("POST /claim with key %s: HTTP 409: the key was already used; the check needs two unused claim keys", p.label)
	}
	if err := ans.decode(http.StatusOK, &r); err != nil {
		return fmt.Errorf("POST /claim with key %s: %w", p.label, err)
	}
	if r.Claimed == nil || !*r.Claimed || r.Host == nil || *r.Host == "" {
		return fmt.Errorf("POST /claim with key %s answered %s, want {\"claimed\":true,\"host\":\"<name>\"}", p.label, quote(ans.body))
	}
	p.host = *r.Host
	c.logf("key %s claimed for host %q", p.label, p.host)
	return nil
}

func (c *checker) postClaim(ctx context.Context, key, owner, phone string) (answer, error) {
	body, err := json.Marshal(struct {
		OwnerToken string `json:"ownerToken"`
		PhoneToken string `json:"phoneToken"`
	}{owner, phone})
	if err != nil {
		return answer{}, fmt.Errorf("encode claim: %w", err)
	}
	return c.call(ctx, http.MethodPost, "/claim", key, body)
}

// expectUsed requires that p's key, already claimed, cannot be claimed
// again, even with tokens the relay has never seen.
func (c *checker) expectUsed(ctx context.Context, p *party) error {
	ans, err := c.postClaim(ctx, p.key, token(), token())
	if err != nil {
		return err
	}
	if err := ans.decodeError(http.StatusConflict); err != nil {
		return fmt.Errorf("POST /claim with used key %s: %w", p.label, err)
	}
	return nil
}

// expectStatus requires GET /status to say whether p's control socket is
// open, and to name the host the claim answered with.
func (c *checker) expectStatus(ctx context.Context, p *party, connected bool) error {
	ans, err := c.call(ctx, http.MethodGet, "/status", p.owner, nil)
	if err != nil {
		return err
	}
	var s struct {
		Connected *bool   `json:"connected"`
		Host      *string `json:"host"`
	}
	if err := ans.decode(http.StatusOK, &s); err != nil {
		return fmt.Errorf("GET /status for %s: %w", p.label, err)
	}
	if s.Connected == nil || *s.Connected != connected || s.Host == nil || *s.Host != p.host {
		return fmt.Errorf("GET /status for %s answered %s, want connected %t and host %q", p.label, quote(ans.body), connected, p.host)
	}
	return nil
}

// awaitConnected waits until GET /status says p's control socket is open.
// Status is the only outside sign that the relay has registered the socket,
// and a relay may send its 101 a moment before it has.
func (c *checker) awaitConnected(ctx context.Context, p *party) error {
	return poll(ctx, func() error { return c.expectStatus(ctx, p, true) })
}

// release releases p's claim and requires the relay to forget the owner
// token.
func (c *checker) release(ctx context.Context, p *party) error {
	ans, err := c.call(ctx, http.MethodDelete, "/claim", p.owner, nil)
	if err != nil {
		return err
	}
	var r struct {
		Released *bool `json:"released"`
	}
	if err := ans.decode(http.StatusOK, &r); err != nil {
		return fmt.Errorf("DELETE /claim for %s: %w", p.label, err)
	}
	if r.Released == nil || !*r.Released {
		return fmt.Errorf("DELETE /claim for %s answered %s, want {\"released\":true}", p.label, quote(ans.body))
	}
	ans, err = c.call(ctx, http.MethodGet, "/status", p.owner, nil)
	if err != nil {
		return err
	}
	if err := ans.decodeError(http.StatusNotFound); err != nil {
		return fmt.Errorf("GET /status with %s's released owner token: %w", p.label, err)
	}
	return nil
}

// poll calls try until it succeeds or ctx ends, backing off between
// attempts. It is only for conditions the relay offers no event for (a
// restart finishing, a socket being registered or forgotten); every attempt
// tests the condition itself, so the pause never stands in for it.
func poll(ctx context.Context, try func() error) error {
	wait := 10 * time.Millisecond
	for {
		err := try()
		if err == nil {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(err, ctx.Err()) {
				return err
			}
			return fmt.Errorf("%w; last attempt: %w", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// readBody reads what a refused WebSocket upgrade said.
func readBody(resp *http.Response) string {
	if resp.Body == nil {
		return `""`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return quote(b)
}

// quote shows a body or frame in an error, shortened: a 70,000-byte frame
// should not become a 70,000-byte error.
func quote(b []byte) string {
	const limit = 200
	if len(b) > limit {
		return fmt.Sprintf("%q... (%d bytes)", b[:limit], len(b))
	}
	return fmt.Sprintf("%q", b)
}
