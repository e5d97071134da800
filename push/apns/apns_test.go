package apns_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/push"
	"edgerelay/push/apns"
	"edgerelay/push/pushtest"
)

const (
	teamID = "TEAM123456"
	keyID  = "KEY1234567"
	topic  = "com.example.zerobyte"
	device = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
)

// setup starts a fake APNs trusting a fresh key and returns it with a
// client signing with that key.
func setup(t testing.TB) (*pushtest.FakeAPNs, *apns.Client) {
	t.Helper()
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, teamID, keyID, &priv.PublicKey)
	return fake, newClient(t, fake, pushtest.WriteFile(t, "AuthKey.p8", p8))
}

func newClient(t testing.TB, fake *pushtest.FakeAPNs, keyFile string) *apns.Client {
	t.Helper()
	c, err := apns.New(apns.Config{
		KeyFile: keyFile, KeyID: keyID, TeamID: teamID,
		BaseURL: fake.URL(), RootCAs: fake.RootCAs(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// The mailbox spec's payloads, with an alert text that encoding/json would
// escape: the bytes must arrive as built.
var (
	alertPayload  = []byte(`{"aps":{"alert":{"body":"Tom & Jerry <3"},"mutable-content":1,"sound":"default"},"zerobyte":{"tag":"Zq3k8r2mT1u0wQ"}}`)
	silentPayload = []byte(`{"aps":{"content-available":1},"zerobyte":{"tag":"Zq3k8r2mT1u0wQ"}}`)
)

func send(t *testing.T, c *apns.Client, n apns.Notification) apns.Result {
	t.Helper()
	res, err := c.Send(context.Background(), n)
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	return res
}

func TestAlertAndBackgroundArriveExactly(t *testing.T) {
	fake, c := setup(t)
	fake.RequireTopic(topic)
	exp := time.Unix(1767225600, 0)

	alert := send(t, c, apns.Notification{
		DeviceToken: device, Topic: topic, PushType: apns.PushTypeAlert,
		Priority: apns.PriorityHigh, Payload: alertPayload,
	})
	silent := send(t, c, apns.Notification{
		DeviceToken: device, Topic: topic, PushType: apns.PushTypeBackground,
		Priority: apns.PriorityLow, Payload: silentPayload, Expiration: exp,
	})
	for _, res := range []apns.Result{alert, silent} {
		if res.Status != 200 || res.Reason != "" || res.APNsID == "" || res.Unregistered || res.Retryable {
			t.Errorf("result %+v, want 200 with an apns-id", res)
		}
	}

	got := fake.Requests()
	if len(got) != 2 {
		t.Fatalf("fake got %d requests, want 2", len(got))
	}
	want := []struct {
		pushType, priority, expiration string
		body                           []byte
	}{
		{"alert", "10", "", alertPayload},
		{"background", "5", "1767225600", silentPayload},
	}
	for i, r := range got {
		if r.Problem != "" || r.Status != 200 {
			t.Errorf("request %d refused: %d %s (%s)", i, r.Status, r.Reason, r.Problem)
		}
		if r.Proto != "HTTP/2.0" {
			t.Errorf("request %d over %s, want HTTP/2.0", i, r.Proto)
		}
		if r.DeviceToken != device {
			t.Errorf("request %d for device %q", i, r.DeviceToken)
		}
		if !bytes.Equal(r.Body, want[i].body) {
			t.Errorf("request %d body\n got %s\nwant %s", i, r.Body, want[i].body)
		}
		h := r.Header
		if h.Get("apns-topic") != topic || h.Get("apns-push-type") != want[i].pushType ||
			h.Get("apns-priority") != want[i].priority || h.Get("apns-expiration") != want[i].expiration {
			t.Errorf("request %d headers: topic %q push-type %q priority %q expiration %q, want %q %q %q %q", i,
				h.Get("apns-topic"), h.Get("apns-push-type"), h.Get("apns-priority"), h.Get("apns-expiration"),
				topic, want[i].pushType, want[i].priority, want[i].expiration)
		}
		if _, ok := h["Apns-Expiration"]; !ok && want[i].expiration != "" {
			t.Errorf("request %d lacks apns-expiration", i)
		}
		if r.KeyID != keyID || time.Since(r.IssuedAt) > time.Minute {
			t.Errorf("request %d provider token kid %q iat %v", i, r.KeyID, r.IssuedAt)
		}
	}
	// One provider token and one connection serve both.
	if got[0].Bearer != got[1].Bearer {
		t.Error("the provider token was not reused")
	}
	if got[0].RemoteAddr != got[1].RemoteAddr {
		t.Errorf("two connections (%s, %s), want one reused", got[0].RemoteAddr, got[1].RemoteAddr)
	}
}

func TestWrongKeyIsRefused(t *testing.T) {
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, teamID, keyID, &priv.PublicKey)
	newClient(t, fake, pushtest.WriteFile(t, "AuthKey.p8", p8)) // the right key works: see other tests

	otherP8, _ := pushtest.NewAPNsKey(t)
	wrong := newClient(t, fake, pushtest.WriteFile(t, "Other.p8", otherP8))
	n := apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}
	res := send(t, wrong, n)
	if res.Status != 403 || res.Reason != "InvalidProviderToken" || res.Unregistered || res.Retryable {
		t.Errorf("result %+v, want 403 InvalidProviderToken", res)
	}
	got := fake.Requests()
	// Refused tokens are renewed once, so the send made two attempts,
	// each with its own token, both refused for the signature.
	if len(got) != 2 || got[0].Bearer == got[1].Bearer {
		t.Fatalf("fake got %d requests, want 2 with distinct tokens", len(got))
	}
	for _, r := range got {
		if r.Status != 403 || !strings.Contains(r.Problem, "signature") {
			t.Errorf("fake answered %d %q (%s), want a refused signature", r.Status, r.Reason, r.Problem)
		}
	}
	// A key that keeps being refused does not turn every send into a
	// token renewal and a second request.
	send(t, wrong, n)
	if got := fake.Requests(); len(got) != 3 {
		t.Errorf("fake got %d requests after the next send, want 3 (no second renewal within a minute)", len(got))
	}
}

func TestUnregisteredAndRetryable(t *testing.T) {
	fake, c := setup(t)
	cases := []struct {
		status       int
		reason       string
		unregistered bool
		retryable    bool
	}{
		{410, "Unregistered", true, false},
		{410, "ExpiredToken", true, false},
		{400, "BadDeviceToken", true, false},
		{400, "DeviceTokenNotForTopic", false, false},
		{400, "BadTopic", false, false},
		{413, "PayloadTooLarge", false, false},
		{429, "TooManyRequests", false, true},
		{500, "InternalServerError", false, true},
		{503, "ServiceUnavailable", false, true},
		{503, "Shutdown", false, true},
	}
	for _, tc := range cases {
		fake.AnswerOnce(device, tc.status, tc.reason)
		res := send(t, c, apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload})
		if res.Status != tc.status || res.Reason != tc.reason || res.Unregistered != tc.unregistered || res.Retryable != tc.retryable {
			t.Errorf("answer %d %s: result %+v, want unregistered %v retryable %v",
				tc.status, tc.reason, res, tc.unregistered, tc.retryable)
		}
	}
	// The answers were one-shot.
	if res := send(t, c, apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}); res.Status != 200 {
		t.Errorf("after the programmed answers: %+v", res)
	}
}

func TestExpiredProviderTokenIsRenewedOnce(t *testing.T) {
	fake, c := setup(t)
	n := apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}
	send(t, c, n)

	// Apple declares the token expired: the next send is refused once,
	// renews the token and succeeds.
	fake.ExpireProviderTokens()
	if res := send(t, c, n); res.Status != 200 {
		t.Fatalf("after expiry: %+v, want 200 after one renewal", res)
	}
	got := fake.Requests()
	if len(got) != 3 {
		t.Fatalf("fake got %d requests, want 3", len(got))
	}
	if got[1].Bearer != got[0].Bearer || got[1].Status != 403 || got[1].Reason != "ExpiredProviderToken" {
		t.Errorf("second request: %d %s with the first token %v", got[1].Status, got[1].Reason, got[1].Bearer == got[0].Bearer)
	}
	if got[2].Bearer == got[0].Bearer || got[2].Status != 200 || got[2].IssuedAt.Before(got[0].IssuedAt) {
		t.Errorf("retry: status %d, fresh token %v, iat %v (first %v)", got[2].Status, got[2].Bearer != got[0].Bearer, got[2].IssuedAt, got[0].IssuedAt)
	}
	// The renewed token is kept for later sends.
	send(t, c, n)
	if got := fake.Requests(); got[3].Bearer != got[2].Bearer || got[3].Status != 200 {
		t.Error("the renewed token was not reused")
	}

	// A token renewed because Apple refused its predecessor is not renewed
	// again within a minute: renewing evidently did not help.
	fake.ExpireProviderTokens()
	if res := send(t, c, n); res.Status != 403 || res.Reason != "ExpiredProviderToken" {
		t.Errorf("second expiry within a minute: %+v, want the 403 without a retry", res)
	}
	if got := fake.Requests(); len(got) != 5 {
		t.Errorf("fake got %d requests, want 5", len(got))
	}
}

func TestProgrammedExpiredProviderToken(t *testing.T) {
	fake, c := setup(t)
	n := apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}
	fake.AnswerOnce(device, 403, "ExpiredProviderToken")
	if res := send(t, c, n); res.Status != 200 {
		t.Fatalf("after a programmed ExpiredProviderToken: %+v", res)
	}
	if got := fake.Requests(); len(got) != 2 || got[1].Bearer == got[0].Bearer || got[0].Status != 403 {
		t.Errorf("fake got %d requests, want a 403 then a fresh token", len(got))
	}
}

func TestDeviceTokenIsPathEscaped(t *testing.T) {
	fake, c := setup(t)
	odd := "ab/../cd?x=1#y %"
	send(t, c, apns.Notification{DeviceToken: odd, Topic: topic, Payload: alertPayload})
	if got := fake.Requests(); len(got) != 1 || got[0].DeviceToken != odd || got[0].Status != 200 {
		t.Fatalf("fake got %+v, want one request for %q", got, odd)
	}
}

func TestConcurrentSendsShareTokenAndConnection(t *testing.T) {
	fake, c := setup(t)
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			res, err := c.Send(context.Background(), apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload})
			if err == nil && res.Status != 200 {
				err = errors.New(res.Reason)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	bearers, conns := map[string]bool{}, map[string]bool{}
	for _, r := range fake.Requests() {
		bearers[r.Bearer], conns[r.RemoteAddr] = true, true
	}
	if len(bearers) != 1 {
		t.Errorf("%d provider tokens, want 1", len(bearers))
	}
	if len(conns) != 1 {
		t.Errorf("%d connections for %d concurrent sends, want HTTP/2 multiplexing", len(conns), n)
	}
}

func TestNotSent(t *testing.T) {
	fake, c := setup(t)
	ok := apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}

	invalid := []apns.Notification{
		{Topic: topic, Payload: alertPayload},
		{DeviceToken: device, Payload: alertPayload},
		{DeviceToken: device, Topic: topic},
		{DeviceToken: device, Topic: topic, Payload: alertPayload, Environment: "staging"},
	}
	for _, n := range invalid {
		if _, err := c.Send(context.Background(), n); !errors.Is(err, push.ErrNotSent) {
			t.Errorf("Send(%+v) = %v, want ErrNotSent", n, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Send(ctx, ok); !errors.Is(err, push.ErrNotSent) {
		t.Errorf("Send with a cancelled context = %v, want ErrNotSent", err)
	}
	if n := len(fake.Requests()); n != 0 {
		t.Errorf("fake got %d requests, want none", n)
	}

	// Nobody listening: not sent.
	fake.Close()
	if _, err := c.Send(context.Background(), ok); err == nil || !errors.Is(err, push.ErrNotSent) {
		t.Errorf("Send to a closed server = %v, want ErrNotSent", err)
	}
}

func TestTimeoutAfterWriteIsNotNotSent(t *testing.T) {
	p8, _ := pushtest.NewAPNsKey(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 2)
	var first sync.Once
	hung := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answered := false
		first.Do(func() { answered = true }) // the first request warms the connection
		if answered {
			return
		}
		arrived <- struct{}{}
		<-release
	}))
	hung.EnableHTTP2 = true
	hung.StartTLS()
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) })

	pool := hung.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c, err := apns.New(apns.Config{
		KeyFile: pushtest.WriteFile(t, "k.p8", p8), KeyID: keyID, TeamID: teamID,
		BaseURL: hung.URL, RootCAs: pool,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}
	send(t, c, n)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Send(ctx, n)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Send took %v despite a 300ms deadline", d)
	}
	if err == nil {
		t.Fatal("Send to a server that never answers succeeded")
	}
	select {
	case <-arrived:
	case <-time.After(2 * time.Second):
		t.Skipf("the request never reached the server (a slow machine?): %v", err)
	}
	// The server saw the request: the error must not claim it was not sent.
	if errors.Is(err, push.ErrNotSent) {
		t.Errorf("Send to a server that never answers = %v, want an error that is not ErrNotSent", err)
	}
}

func TestNew(t *testing.T) {
	p8, _ := pushtest.NewAPNsKey(t)
	good := pushtest.WriteFile(t, "good.p8", p8)
	_, googleKey, _ := pushtest.NewServiceAccount(t, "https://example.invalid/token")
	_ = googleKey
	cases := []struct {
		name string
		cfg  apns.Config
		ok   bool
	}{
		{"minimal", apns.Config{KeyFile: good, KeyID: keyID, TeamID: teamID}, true},
		{"development", apns.Config{KeyFile: good, KeyID: keyID, TeamID: teamID, Environment: " Development "}, true},
		{"sandbox", apns.Config{KeyFile: good, KeyID: keyID, TeamID: teamID, Environment: "SANDBOX"}, true},
		{"missing file", apns.Config{KeyFile: good + ".nope", KeyID: keyID, TeamID: teamID}, false},
		{"not PEM", apns.Config{KeyFile: pushtest.WriteFile(t, "x.p8", []byte("hello")), KeyID: keyID, TeamID: teamID}, false},
		{"not a key", apns.Config{KeyFile: pushtest.WriteFile(t, "y.p8", []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")), KeyID: keyID, TeamID: teamID}, false},
		{"no key id", apns.Config{KeyFile: good, TeamID: teamID}, false},
		{"no team id", apns.Config{KeyFile: good, KeyID: keyID}, false},
		{"bad environment", apns.Config{KeyFile: good, KeyID: keyID, TeamID: teamID, Environment: "staging"}, false},
		{"http base URL", apns.Config{KeyFile: good, KeyID: keyID, TeamID: teamID, BaseURL: "http://127.0.0.1:1"}, false},
	}
	for _, tc := range cases {
		c, err := apns.New(tc.cfg)
		if (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok %v", tc.name, err, tc.ok)
		}
		if c != nil {
			c.Close()
		}
	}
}

// TestSystemRootsHonourSSLCertFile runs a child process whose client has
// no RootCAs, trusting the fake only through SSL_CERT_FILE, as the relay
// does in black-box tests.
func TestSystemRootsHonourSSLCertFile(t *testing.T) {
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" || runtime.GOOS == "windows" {
		t.Skip("the platform verifier ignores SSL_CERT_FILE")
	}
	if os.Getenv("PUSHTEST_CHILD") == "1" {
		c, err := apns.New(apns.Config{
			KeyFile: os.Getenv("PUSHTEST_KEY"), KeyID: keyID, TeamID: teamID, BaseURL: os.Getenv("PUSHTEST_URL"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if res := send(t, c, apns.Notification{DeviceToken: device, Topic: topic, Payload: alertPayload}); res.Status != 200 {
			t.Fatalf("child: %+v", res)
		}
		return
	}
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, teamID, keyID, &priv.PublicKey)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSystemRootsHonourSSLCertFile$")
	cmd.Env = append(os.Environ(),
		"PUSHTEST_CHILD=1",
		"PUSHTEST_KEY="+pushtest.WriteFile(t, "AuthKey.p8", p8),
		"PUSHTEST_URL="+fake.URL(),
		"SSL_CERT_FILE="+pushtest.WriteFile(t, "ca.pem", fake.CertPEM()),
		"SSL_CERT_DIR=/nonexistent",
	)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if got := fake.Requests(); len(got) != 1 || got[0].Status != 200 {
		t.Fatalf("fake got %+v, want one accepted request", got)
	}
}

// BenchmarkAPNsSend measures sequential and parallel sends against the
// fake over one HTTP/2 connection. The fake runs in the same process, so
// the figure bounds the client and server together; pushes/s is per run,
// divide by GOMAXPROCS for per core.
func BenchmarkAPNsSend(b *testing.B) {
	n := apns.Notification{
		DeviceToken: device, Topic: topic, PushType: apns.PushTypeAlert,
		Priority: apns.PriorityHigh, Payload: alertPayload,
	}
	b.Run("sequential", func(b *testing.B) {
		_, c := setup(b)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if res, err := c.Send(ctx, n); err != nil || res.Status != 200 {
				b.Fatalf("%+v %v", res, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pushes/s")
	})
	b.Run("parallel", func(b *testing.B) {
		_, c := setup(b)
		ctx := context.Background()
		b.ReportAllocs()
		b.SetParallelism(8)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if res, err := c.Send(ctx, n); err != nil || res.Status != 200 {
					b.Errorf("%+v %v", res, err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pushes/s")
	})
}
