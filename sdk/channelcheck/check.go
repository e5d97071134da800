// Package channelcheck checks a private channel relay (botharness-private-v1
// and v2) from the outside, over HTTP(S) and WS(S) only, so the same check
// runs against our relay, a competitor's, or one behind a proxy.
//
// It is deliberately independent of the relay's code: WebSockets go through
// the gorilla-compatible client in github.com/fasthttp/websocket rather than
// our own framing, so a bug shared by our server and our client cannot hide.
//
// Run spends the two claim keys it is given: they cannot be claimed again,
// which is one of the things it checks.
package channelcheck

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fasthttp/websocket"
)

// DefaultTimeout bounds each check when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Options say which relay to check and with what.
type Options struct {
	// Origin is the relay's base URL, http(s)://host:port (a path prefix is
	// kept). The WebSocket URLs are derived from it: ws for http, wss for
	// https.
	Origin string
	// KeyA and KeyB are two claim keys nobody has used; Run uses them up.
	KeyA, KeyB string
	// TLSConfig is used for HTTPS and WSS, e.g. to trust a private CA. Nil
	// means Go's defaults.
	TLSConfig *tls.Config
	// Restart, if set, is called after A's release to restart the relay;
	// Run then waits for GET /health and checks that both keys still answer
	// 409, i.e. that claim state survives a restart. It must return once
	// ctx (bounded by Timeout) is done.
	Restart func(ctx context.Context) error
	// Timeout bounds each check (every wait inside it), DefaultTimeout if
	// zero.
	Timeout time.Duration
	// Log, if set, receives progress lines as the checks run.
	Log io.Writer
}

// Check is the outcome of one named check.
type Check struct {
	Name string
	// Err is nil when the check passed. A check that could not run because
	// one it depends on failed has Err "skipped: <dependency> failed".
	Err error
}

// Report lists every check in the order it ran.
type Report struct {
	Checks []Check
}

// Passed reports whether there was at least one check and every check passed.
func (r Report) Passed() bool {
	if len(r.Checks) == 0 {
		return false
	}
	for _, c := range r.Checks {
		if c.Err != nil {
			return false
		}
	}
	return true
}

// Failed returns the checks that failed (including skipped ones), in order.
func (r Report) Failed() []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Err != nil {
			out = append(out, c)
		}
	}
	return out
}

// The checks' names, in the order Run performs them. They are part of the
// output operators read, so they stay stable.
const (
	checkOptions              = "options"
	checkHealth               = "health"
	checkClaimA               = "claim A"
	checkClaimB               = "claim B"
	checkStatusIdle           = "status A before connecting"
	checkComputerA            = "connect computer A"
	checkComputerB            = "connect computer B"
	checkStatusConnected      = "status A while connected"
	checkPhoneA               = "connect phone A (Authorization: Bearer)"
	checkPhoneB               = "connect phone B (X-BotHarness-Admission)"
	checkOpenA                = "computer A gets open for phone A"
	checkOpenB                = "computer B gets open for phone B"
	checkUpA                  = "phone A reaches only computer A"
	checkUpB                  = "phone B reaches only computer B"
	checkDownA                = "computer A reaches only phone A"
	checkDownB                = "computer B reaches only phone B"
	checkForeignID            = "computer B cannot send to phone A's id"
	checkSpecialUp            = "special characters phone to computer"
	checkSpecialDown          = "special characters computer to phone"
	checkMaxFrame             = "70000-byte frame passes both ways"
	checkOversize             = "70001-byte frame closes phone with 1009"
	checkReconnectPhoneA      = "reconnect phone A"
	checkOfflineA             = "computer A offline closes phone A with 1001"
	checkBAfterOffline        = "B works after A went offline"
	checkReconnectComputerA   = "reconnect computer A"
	checkReleaseA             = "release A"
	checkReleaseClosesA       = "release A closes computer A's socket"
	checkBAfterRelease        = "B works after A released"
	checkReclaimA             = "claim A again answers 409"
	checkRestart              = "restart relay"
	checkHealthAfterRestart   = "health after restart"
	checkReclaimAAfterRestart = "claim A after restart answers 409"
	checkReclaimBAfterRestart = "claim B after restart answers 409"
	checkNoStore              = "every HTTP answer has Cache-Control: no-store"
)

// party is one computer with its phone, as the checker plays it.
type party struct {
	label      string // "A" or "B"
	key        string // claim key
	owner      string // owner token
	phoneToken string
	host       string // host name the relay answered the claim with

	computer *peer
	phone    *peer
	// id is the relay's id for the phone's current channel.
	id string
	// staleIDs are ids of this computer's earlier channels, whose late
	// messages nextControl skips.
	staleIDs map[string]bool
}

// checker holds one Run's state. Everything is used from Run's goroutine
// only, apart from each peer's reader.
type checker struct {
	o       Options
	httpURL *url.URL
	wsURL   *url.URL
	tr      *http.Transport
	client  *http.Client
	dialer  *websocket.Dialer

	report  Report
	failed  map[string]bool
	noStore []string          // answers that lacked Cache-Control: no-store
	current string            // the check running
	sent    map[string]string // every frame sent, to its sender and check
	peers   []*peer           // every socket opened, closed at the end

	a, b *party
}

// Run performs every check against the relay at o.Origin and reports each
// one. It never panics on a misbehaving relay and closes every socket it
// opened before returning. Cancelling ctx fails the checks not yet run.
func Run(ctx context.Context, o Options) Report {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	c, err := newChecker(o)
	if err != nil {
		return Report{Checks: []Check{{Name: checkOptions, Err: err}}}
	}
	defer c.cleanup()
	c.run(ctx)
	return c.report
}

func newChecker(o Options) (*checker, error) {
	u, err := url.Parse(o.Origin)
	if err != nil {
		return nil, fmt.Errorf("origin %q: %w", o.Origin, err)
	}
	if u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("origin %q: want http(s)://host[:port]", o.Origin)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("origin %q: no query or fragment allowed", o.Origin)
	}
	switch {
	case o.KeyA == "" || o.KeyB == "":
		return nil, errors.New("two claim keys are needed")
	case o.KeyA == o.KeyB:
		return nil, errors.New("claim keys A and B are the same key")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	ws := *u
	ws.Scheme = "ws"
	if u.Scheme == "https" {
		ws.Scheme = "wss"
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     o.TLSConfig,
		TLSHandshakeTimeout: o.Timeout,
		ForceAttemptHTTP2:   true,
	}
	return &checker{
		o:       o,
		httpURL: u,
		wsURL:   &ws,
		tr:      tr,
		// A redirect is reported, not followed: the contract is about what
		// the origin itself answers, and WebSockets do not follow one.
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		dialer: &websocket.Dialer{
			Proxy:            http.ProxyFromEnvironment,
			TLSClientConfig:  o.TLSConfig,
			HandshakeTimeout: o.Timeout,
		},
		failed: make(map[string]bool),
		sent:   make(map[string]string),
		a:      &party{label: "A", key: o.KeyA, staleIDs: make(map[string]bool)},
		b:      &party{label: "B", key: o.KeyB, staleIDs: make(map[string]bool)},
	}, nil
}

// run performs the checks in the order the contract lists them.
func (c *checker) run(ctx context.Context) {
	a, b := c.a, c.b
	c.step(ctx, checkHealth, nil, c.checkHealth)
	c.step(ctx, checkClaimA, nil, func(ctx context.Context) error { return c.claim(ctx, a) })
	c.step(ctx, checkClaimB, nil, func(ctx context.Context) error { return c.claim(ctx, b) })
	c.step(ctx, checkStatusIdle, deps(checkClaimA), func(ctx context.Context) error {
		return c.expectStatus(ctx, a, false)
	})
	c.step(ctx, checkComputerA, deps(checkClaimA), func(ctx context.Context) error { return c.connectComputer(ctx, a) })
	c.step(ctx, checkComputerB, deps(checkClaimB), func(ctx context.Context) error { return c.connectComputer(ctx, b) })
	c.step(ctx, checkStatusConnected, deps(checkComputerA), func(ctx context.Context) error {
		return c.awaitConnected(ctx, a)
	})
	c.step(ctx, checkPhoneA, deps(checkComputerA), func(ctx context.Context) error {
		return c.connectPhone(ctx, a, "Authorization", "Bearer "+a.phoneToken)
	})
	c.step(ctx, checkPhoneB, deps(checkComputerB), func(ctx context.Context) error {
		return c.connectPhone(ctx, b, "X-BotHarness-Admission", b.phoneToken)
	})
	c.step(ctx, checkOpenA, deps(checkPhoneA), func(ctx context.Context) error { return c.expectOpen(ctx, a) })
	c.step(ctx, checkOpenB, deps(checkPhoneB), func(ctx context.Context) error { return c.expectOpen(ctx, b) })

	both := deps(checkOpenA, checkOpenB)
	c.step(ctx, checkUpA, both, func(ctx context.Context) error { return c.phoneReachesOnlyItsComputer(ctx, a, b) })
	c.step(ctx, checkUpB, both, func(ctx context.Context) error { return c.phoneReachesOnlyItsComputer(ctx, b, a) })
	c.step(ctx, checkDownA, both, func(ctx context.Context) error { return c.computerReachesOnlyItsPhone(ctx, a, b) })
	c.step(ctx, checkDownB, both, func(ctx context.Context) error { return c.computerReachesOnlyItsPhone(ctx, b, a) })
	c.step(ctx, checkForeignID, both, func(ctx context.Context) error { return c.foreignIDIgnored(ctx, a, b) })
	c.step(ctx, checkSpecialUp, deps(checkOpenA), func(ctx context.Context) error { return c.specialUp(ctx, a) })
	c.step(ctx, checkSpecialDown, deps(checkOpenA), func(ctx context.Context) error { return c.specialDown(ctx, a) })
	c.step(ctx, checkMaxFrame, deps(checkOpenA), func(ctx context.Context) error { return c.maxFrame(ctx, a) })
	c.step(ctx, checkOversize, deps(checkOpenA), func(ctx context.Context) error { return c.oversize(ctx, a) })

	c.step(ctx, checkReconnectPhoneA, deps(checkComputerA), func(ctx context.Context) error { return c.reconnectPhone(ctx, a) })
	c.step(ctx, checkOfflineA, deps(checkReconnectPhoneA), func(ctx context.Context) error { return c.offline(ctx, a) })
	c.step(ctx, checkBAfterOffline, deps(checkOpenB), func(ctx context.Context) error { return c.roundTrip(ctx, b) })
	c.step(ctx, checkReconnectComputerA, deps(checkComputerA), func(ctx context.Context) error {
		return c.reconnectComputer(ctx, a)
	})

	c.step(ctx, checkReleaseA, deps(checkClaimA), func(ctx context.Context) error { return c.release(ctx, a) })
	c.step(ctx, checkReleaseClosesA, deps(checkReconnectComputerA, checkReleaseA), func(ctx context.Context) error {
		return c.expectClosed(ctx, a.computer, 0)
	})
	c.step(ctx, checkBAfterRelease, deps(checkOpenB, checkReleaseA), func(ctx context.Context) error { return c.roundTrip(ctx, b) })
	c.step(ctx, checkReclaimA, deps(checkClaimA), func(ctx context.Context) error { return c.expectUsed(ctx, a) })

	if c.o.Restart != nil {
		// The relay is going away: close our side first so the restart
		// does not race our own sockets.
		c.closePeers()
		c.step(ctx, checkRestart, nil, func(ctx context.Context) error {
			if err := c.o.Restart(ctx); err != nil {
				return fmt.Errorf("restart hook: %w", err)
			}
			return nil
		})
		// The restart dropped every kept-alive connection; do not let the
		// first POST land on one of them.
		c.tr.CloseIdleConnections()
		c.step(ctx, checkHealthAfterRestart, deps(checkRestart), c.awaitHealth)
		c.step(ctx, checkReclaimAAfterRestart, deps(checkHealthAfterRestart, checkClaimA), func(ctx context.Context) error {
			return c.expectUsed(ctx, a)
		})
		c.step(ctx, checkReclaimBAfterRestart, deps(checkHealthAfterRestart, checkClaimB), func(ctx context.Context) error {
			return c.expectUsed(ctx, b)
		})
	}
	c.step(ctx, checkNoStore, nil, func(context.Context) error {
		if len(c.noStore) == 0 {
			return nil
		}
		return fmt.Errorf("missing on %s", strings.Join(c.noStore, "; "))
	})
}

func deps(names ...string) []string { return names }

// step runs one check under its own Timeout, unless a check it depends on
// failed: then running it would only repeat that failure, so it is recorded
// as skipped (and failed, so that a partial run never reads as a pass).
func (c *checker) step(ctx context.Context, name string, needs []string, fn func(context.Context) error) {
	if err := ctx.Err(); err != nil {
		c.record(name, fmt.Errorf("skipped: run cancelled: %w", err))
		return
	}
	for _, d := range needs {
		if c.failed[d] {
			c.record(name, fmt.Errorf("skipped: %s failed", d))
			return
		}
	}
	c.logf("%s ...", name)
	c.current = name
	sctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	err := fn(sctx)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = fmt.Errorf("%w (step bound %s)", err, c.o.Timeout)
	}
	c.record(name, err)
}

func (c *checker) record(name string, err error) {
	c.report.Checks = append(c.report.Checks, Check{Name: name, Err: err})
	if err != nil {
		c.failed[name] = true
		c.logf("FAIL %s: %v", name, err)
	} else {
		c.logf("ok   %s", name)
	}
}

func (c *checker) logf(format string, args ...any) {
	if c.o.Log != nil {
		fmt.Fprintf(c.o.Log, "channelcheck: "+format+"\n", args...)
	}
}

// cleanup closes every socket and idle connection Run opened.
func (c *checker) cleanup() {
	c.closePeers()
	c.tr.CloseIdleConnections()
}

// closePeers closes every socket and waits, bounded, for its reader to end
// so that Run leaves no goroutine behind.
func (c *checker) closePeers() {
	for _, p := range c.peers {
		p.close()
	}
	deadline := time.NewTimer(c.o.Timeout)
	defer deadline.Stop()
	for _, p := range c.peers {
		select {
		case <-p.done:
		case <-deadline.C:
			c.logf("%s: reader did not end after close", p.name)
			return
		}
	}
}

// token returns a fresh owner or phone token: 64 lowercase hex.
func token() string {
	return hex.EncodeToString(randomBytes(32))
}

// nonce returns a short random string that makes every frame Run sends
// unique, so a stale or misrouted frame can never pass for the expected one.
func nonce() string {
	return hex.EncodeToString(randomBytes(8))
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	// crypto/rand.Read never returns an error (it crashes the program
	// instead if the system's source fails).
	_, _ = rand.Read(b)
	return b
}
