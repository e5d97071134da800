package fcm_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/push"
	"edgerelay/push/fcm"
	"edgerelay/push/pushtest"
)

const regToken = "dXNlcjE6QVBBOTFiRl9zb21lLXJlZ2lzdHJhdGlvbi10b2tlbi0xMjM0NTY3ODkw"

// The mailbox spec's alert body and the gateway's body, as their features
// build them; they must arrive byte for byte.
var (
	mailboxAlert = []byte(`{"message":{"token":"` + regToken + `","data":{"zerobyte_tag":"Zq3k8r2mT1u0wQ","zerobyte_notify":"alert","zerobyte_alert":"New message"},"android":{"priority":"high","ttl":"604800s"}}}`)
	gatewayBody  = []byte(`{"message":{"token":"` + regToken + `","data":{"url":"/read","title":"Tom & Jerry <3"},"android":{"priority":"HIGH"}}}`)
)

func setup(t *testing.T) (*pushtest.FakeGoogle, *fcm.Client) {
	t.Helper()
	g, creds, _ := pushtest.NewGoogleWithAccount(t)
	return g, newClient(t, g, pushtest.WriteFile(t, "service-account.json", creds))
}

func newClient(t *testing.T, g *pushtest.FakeGoogle, credsFile string) *fcm.Client {
	t.Helper()
	c, err := fcm.New(fcm.Config{CredentialsFile: credsFile, BaseURL: g.URL(), RootCAs: g.RootCAs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func send(t *testing.T, c *fcm.Client, msg []byte) fcm.Result {
	t.Helper()
	res, err := c.Send(context.Background(), msg)
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	return res
}

func TestTokenFlowAndExactBody(t *testing.T) {
	g, creds, _ := pushtest.NewGoogleWithAccount(t)
	c := newClient(t, g, pushtest.WriteFile(t, "sa.json", creds))
	if c.ProjectID() != pushtest.ServiceAccountProject {
		t.Errorf("ProjectID %q", c.ProjectID())
	}

	for _, body := range [][]byte{mailboxAlert, gatewayBody} {
		res := send(t, c, body)
		if res.Status != 200 || !strings.HasPrefix(res.Name, "projects/"+pushtest.ServiceAccountProject+"/messages/") ||
			res.ErrorCode != "" || res.Unregistered || res.Retryable {
			t.Errorf("result %+v, want 200 with a message name", res)
		}
	}

	grants := g.Grants()
	if len(grants) != 1 {
		t.Fatalf("%d token grants, want 1 (the token is cached)", len(grants))
	}
	gr := grants[0]
	if gr.Status != 200 || gr.Issuer != pushtest.ServiceAccountEmail || gr.Audience != g.TokenURL() ||
		gr.Scope != fcm.Scope || gr.KeyID == "" || time.Since(gr.IssuedAt) > time.Minute {
		t.Errorf("grant %+v", gr)
	}
	if !strings.Contains(string(creds), `"private_key_id": "`+gr.KeyID+`"`) {
		t.Errorf("assertion kid %q is not the account's private_key_id", gr.KeyID)
	}

	sends := g.Sends()
	if len(sends) != 2 {
		t.Fatalf("%d sends, want 2", len(sends))
	}
	for i, body := range [][]byte{mailboxAlert, gatewayBody} {
		s := sends[i]
		if s.Problem != "" || s.Status != 200 {
			t.Errorf("send %d refused: %d %s (%s)", i, s.Status, s.ErrorCode, s.Problem)
		}
		if !bytes.Equal(s.Body, body) {
			t.Errorf("send %d body\n got %s\nwant %s", i, s.Body, body)
		}
		if s.Project != pushtest.ServiceAccountProject || s.AccessToken != gr.AccessToken || s.RegistrationToken != regToken {
			t.Errorf("send %d: project %q, token issued %v, registration %q", i, s.Project, s.AccessToken == gr.AccessToken, s.RegistrationToken)
		}
		if ct := s.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("send %d content type %q", i, ct)
		}
		if s.Proto != "HTTP/2.0" {
			t.Errorf("send %d over %s, want HTTP/2.0", i, s.Proto)
		}
	}
}

func TestAnswers(t *testing.T) {
	g, c := setup(t)
	cases := []struct {
		name         string
		answer       pushtest.FCMAnswer
		code         string
		unregistered bool
		retryable    bool
		retryAfter   time.Duration
	}{
		{"unregistered", pushtest.FCMUnregistered(), "UNREGISTERED", true, false, 0},
		{"invalid argument", pushtest.FCMInvalidArgument(), "INVALID_ARGUMENT", false, false, 0},
		{"sender id mismatch", pushtest.FCMSenderIDMismatch(), "SENDER_ID_MISMATCH", false, false, 0},
		// A 404 without the UNREGISTERED detail deletes nothing.
		{"not found", pushtest.FCMAnswer{Code: 404, Status: "NOT_FOUND", Message: "Requested entity was not found."}, "NOT_FOUND", false, false, 0},
		{"unavailable", pushtest.FCMUnavailable(), "UNAVAILABLE", false, true, 0},
		{"internal", pushtest.FCMInternal(), "INTERNAL", false, true, 0},
		{"quota", pushtest.FCMQuotaExceeded(30 * time.Second), "QUOTA_EXCEEDED", false, true, 30 * time.Second},
	}
	for _, tc := range cases {
		g.AnswerOnce(regToken, tc.answer)
		res := send(t, c, mailboxAlert)
		if res.Status != tc.answer.Code || res.ErrorCode != tc.code || res.Unregistered != tc.unregistered ||
			res.Retryable != tc.retryable || res.RetryAfter != tc.retryAfter || res.Message != tc.answer.Message {
			t.Errorf("%s: result %+v", tc.name, res)
		}
	}
	if res := send(t, c, mailboxAlert); res.Status != 200 {
		t.Errorf("after the one-shot answers: %+v", res)
	}
	// A sticky answer holds until replaced.
	g.Answer(regToken, pushtest.FCMUnregistered())
	for range 2 {
		if res := send(t, c, mailboxAlert); !res.Unregistered {
			t.Errorf("sticky UNREGISTERED: %+v", res)
		}
	}
}

func TestRevokedTokenIsReplacedOnce(t *testing.T) {
	g, c := setup(t)
	send(t, c, mailboxAlert)
	g.RevokeTokens()
	if res := send(t, c, mailboxAlert); res.Status != 200 {
		t.Fatalf("after revocation: %+v, want 200 after one new token", res)
	}
	grants, sends := g.Grants(), g.Sends()
	if len(grants) != 2 || grants[0].AccessToken == grants[1].AccessToken {
		t.Fatalf("%d grants, want 2 distinct", len(grants))
	}
	if len(sends) != 3 {
		t.Fatalf("%d sends, want 3", len(sends))
	}
	if sends[1].Status != 401 || sends[1].AccessToken != grants[0].AccessToken {
		t.Errorf("second send: %d with the first token %v", sends[1].Status, sends[1].AccessToken == grants[0].AccessToken)
	}
	if sends[2].Status != 200 || sends[2].AccessToken != grants[1].AccessToken {
		t.Errorf("retry: %d with the new token %v", sends[2].Status, sends[2].AccessToken == grants[1].AccessToken)
	}
	if !bytes.Equal(sends[2].Body, mailboxAlert) {
		t.Error("the retried body differs")
	}

	// The renewed token is kept.
	send(t, c, mailboxAlert)
	if sends := g.Sends(); len(sends) != 4 || sends[3].AccessToken != grants[1].AccessToken || len(g.Grants()) != 2 {
		t.Error("the renewed token was not reused")
	}
}

func TestPersistent401(t *testing.T) {
	g, c := setup(t)
	g.Answer(regToken, pushtest.FCMUnauthenticated())
	// One retry with a fresh token, then the 401 is the answer.
	if res := send(t, c, mailboxAlert); res.Status != 401 || res.ErrorCode != "UNAUTHENTICATED" || res.Retryable || res.Unregistered {
		t.Errorf("persistent 401: %+v", res)
	}
	if s, gr := len(g.Sends()), len(g.Grants()); s != 2 || gr != 2 {
		t.Errorf("%d sends and %d grants, want 2 and 2", s, gr)
	}
	// The renewed token is not renewed again within a minute.
	if res := send(t, c, mailboxAlert); res.Status != 401 {
		t.Errorf("second send: %+v", res)
	}
	if s, gr := len(g.Sends()), len(g.Grants()); s != 3 || gr != 2 {
		t.Errorf("%d sends and %d grants, want 3 and 2", s, gr)
	}
}

func TestShortLivedTokensAreNotReused(t *testing.T) {
	g, c := setup(t)
	// A token with under a minute left is replaced before use.
	g.SetTokenLifetime(50 * time.Second)
	send(t, c, mailboxAlert)
	send(t, c, mailboxAlert)
	if n := len(g.Grants()); n != 2 {
		t.Errorf("%d grants for two sends with 50 s tokens, want 2", n)
	}
	g.SetTokenLifetime(time.Hour)
	send(t, c, mailboxAlert)
	send(t, c, mailboxAlert)
	if n := len(g.Grants()); n != 3 {
		t.Errorf("%d grants, want 3", n)
	}
}

func TestWrongKeyIsRefused(t *testing.T) {
	g, _, _ := pushtest.NewGoogleWithAccount(t)
	// Same account, another key: the signature does not verify.
	creds, _, _ := pushtest.NewServiceAccount(t, g.TokenURL())
	c := newClient(t, g, pushtest.WriteFile(t, "wrong.json", creds))
	_, err := c.Send(context.Background(), mailboxAlert)
	if !errors.Is(err, push.ErrNotSent) {
		t.Errorf("Send with a wrong key = %v, want ErrNotSent", err)
	}
	grants := g.Grants()
	if len(grants) != 1 || grants[0].Status != 400 || !strings.Contains(grants[0].Problem, "signature") {
		t.Errorf("grants %+v, want one refused for its signature", grants)
	}
	if n := len(g.Sends()); n != 0 {
		t.Errorf("%d sends reached FCM without a token", n)
	}
}

func TestConcurrentSendsFetchOneToken(t *testing.T) {
	g, c := setup(t)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			if res, err := c.Send(context.Background(), mailboxAlert); err != nil || res.Status != 200 {
				t.Errorf("%+v %v", res, err)
			}
		})
	}
	wg.Wait()
	if n := len(g.Grants()); n != 1 {
		t.Errorf("%d grants for a burst, want 1", n)
	}
}

func TestFakeRefusesMalformedMessages(t *testing.T) {
	g, c := setup(t)
	bad := []string{
		`not json`,
		`{"message":null}`,
		`{"message":{"data":{"a":"b"}}}`,
		`{"message":{"token":"t","data":{"n":1}}}`,
		`{"message":{"token":"t","android":{"priority":"urgent"}}}`,
		`{"message":{"token":"t","android":{"ttl":"1h"}}}`,
		`{"message":{"token":"t","platform":"android"}}`,
	}
	for _, body := range bad {
		res := send(t, c, []byte(body))
		if res.Status != 400 || res.ErrorCode != "INVALID_ARGUMENT" {
			t.Errorf("%s: %+v, want 400 INVALID_ARGUMENT", body, res)
		}
	}
	if _, err := c.Send(context.Background(), nil); !errors.Is(err, push.ErrNotSent) {
		t.Errorf("empty message: %v, want ErrNotSent", err)
	}
	_ = g
}

func TestNotSentWhenUnreachable(t *testing.T) {
	g, c := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Send(ctx, mailboxAlert); !errors.Is(err, push.ErrNotSent) {
		t.Errorf("cancelled context: %v, want ErrNotSent", err)
	}
	if n := len(g.Grants()) + len(g.Sends()); n != 0 {
		t.Errorf("a cancelled send made %d requests", n)
	}
	// No token yet and the token endpoint down: FCM is never contacted.
	g.Close()
	if _, err := c.Send(context.Background(), mailboxAlert); !errors.Is(err, push.ErrNotSent) {
		t.Errorf("token endpoint down: %v, want ErrNotSent", err)
	}
}

func TestTokenEndpointRefusalIsNotSent(t *testing.T) {
	g, c := setup(t)
	// The account's key is no longer trusted (rotated, deleted).
	_, other, _ := pushtest.NewServiceAccount(t, g.TokenURL())
	g.Trust(pushtest.ServiceAccountEmail, &other.PublicKey)
	if _, err := c.Send(context.Background(), mailboxAlert); !errors.Is(err, push.ErrNotSent) {
		t.Errorf("refused grant: %v, want ErrNotSent", err)
	}
	if n := len(g.Sends()); n != 0 {
		t.Errorf("%d sends without a token", n)
	}
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, _, _ := pushtest.NewServiceAccount(t, "https://oauth2.googleapis.com/token")
	replace := func(old, new string) string { return strings.Replace(string(good), old, new, 1) }
	cases := []struct {
		name string
		cfg  fcm.Config
		ok   bool
	}{
		{"good", fcm.Config{CredentialsFile: write("good.json", string(good))}, true},
		{"missing", fcm.Config{CredentialsFile: dir + "/nope.json"}, false},
		{"not json", fcm.Config{CredentialsFile: write("x.json", "{")}, false},
		{"user credentials", fcm.Config{CredentialsFile: write("u.json", replace(`"service_account"`, `"authorized_user"`))}, false},
		{"no project", fcm.Config{CredentialsFile: write("p.json", replace(`"project_id": "`+pushtest.ServiceAccountProject+`"`, `"project_id": ""`))}, false},
		{"no email", fcm.Config{CredentialsFile: write("e.json", replace(`"client_email": "`+pushtest.ServiceAccountEmail+`"`, `"client_email": ""`))}, false},
		{"bad key", fcm.Config{CredentialsFile: write("k.json", replace(`"private_key": "-----BEGIN PRIVATE KEY-----\nMII`, `"private_key": "-----BEGIN PRIVATE KEY-----\nXXX`))}, false},
		{"bad base", fcm.Config{CredentialsFile: write("b.json", string(good)), BaseURL: "ftp://x"}, false},
	}
	for _, tc := range cases {
		c, err := fcm.New(tc.cfg)
		if (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok %v", tc.name, err, tc.ok)
		}
		if c != nil {
			c.Close()
		}
	}
}
