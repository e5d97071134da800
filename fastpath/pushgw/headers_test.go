package pushgw_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// headDeadline bounds the wait for an answer decided from the headers:
// far below the listener's 10 s read timeout, so an answer that waited for
// the body (or the timeout) fails.
const headDeadline = 2 * time.Second

// headersOnly sends the head of one request (no body byte) and returns the
// first answer that arrives within headDeadline, with its body.
func headersOnly(t *testing.T, addr, head string) (a answer, closes bool, conn net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(headDeadline))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within %v to headers only:\n%s\n%v", headDeadline, head, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// Go reads Connection: close into resp.Close.
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, resp.Close, conn
}

// head is a request head: method, path, extra header lines, and
// Content-Length (or chunked when length is -1).
func head(method, path string, length int, lines ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n", method, path)
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	if length < 0 {
		b.WriteString("Transfer-Encoding: chunked\r\n")
	} else {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", length)
	}
	b.WriteString("\r\n")
	return b.String()
}

// Every refusal the headers decide is answered before any body byte is
// read, with or without Expect: 100-continue (then instead of 100
// Continue), and the connection closes after it (the body may follow).
func TestRefusalsFromHeadersAnsweredAtOnce(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100})
	id, key := g.newKey("server")
	disabledID, disabled := g.newKey("disabled")
	if err := g.keys.Disable(disabledID); err != nil {
		t.Fatal(err)
	}
	nk, err := g.keys.Create("expiring", g.clock.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g.clock.Advance(time.Minute)
	_ = id
	bearer := func(k string) string { return "Authorization: Bearer " + k }
	for _, tc := range []struct {
		name string
		head string
		code int
		want string
	}{
		{"413 past the limit", head("POST", "/send", 16385, bearer(key)), 413, errBody("request body too large")},
		{"413 a megabyte", head("POST", "/send", 1<<20, bearer(key)), 413, errBody("request body too large")},
		{"401 no key", head("POST", "/send", 100), 401, errBody("missing api key")},
		{"401 no key, oversized", head("POST", "/send", 1<<20), 401, errBody("missing api key")},
		{"401 no key, chunked", head("POST", "/send", -1), 401, errBody("missing api key")},
		{"401 unknown key", head("POST", "/send", 100, bearer(strings.Repeat("0", 64))), 401, errBody("invalid api key")},
		{"401 disabled key", head("POST", "/send", 100, bearer(disabled)), 401, errBody("invalid api key")},
		{"401 expired key", head("POST", "/send", 100, bearer(nk.Key)), 401,
			`{"error":"api key expired","requestId":"{rid}","expiresAt":"2026-03-01T12:01:00.000Z"}`},
		{"403 registration closed", head("POST", "/register", 20), 403, errBody("self-registration is disabled")},
		{"404 unknown route", head("POST", "/admin/keys", 100, bearer(key)), 404, errBody("not found")},
		{"404 wrong method", head("PUT", "/send", 100, bearer(key)), 404, errBody("not found")},
	} {
		for _, expect100 := range []bool{false, true} {
			h := tc.head
			if expect100 {
				h = strings.Replace(h, "\r\n\r\n", "\r\nExpect: 100-continue\r\n\r\n", 1)
			}
			a, closes, _ := headersOnly(t, g.addr, h)
			what := fmt.Sprintf("%s (expect %v)", tc.name, expect100)
			expect(t, what, a, tc.code, tc.want)
			if !closes {
				t.Errorf("%s: no Connection: close (the body may still come)", what)
			}
		}
	}

	// At the limit the body is wanted: Expect gets 100 Continue, and the
	// send goes through once the body follows.
	body := bodyOfSize(t, 16384)
	a, _, conn := headersOnly(t, g.addr, head("POST", "/send", len(body), bearer(key), "Expect: 100-continue"))
	if a.status != 100 {
		t.Fatalf("16384 bytes with Expect: %d %s, want 100 Continue", a.status, a.body)
	}
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("16384 bytes after 100 Continue: %v %v", resp, err)
	}
}

func TestRegisterRefusalsFromHeaders(t *testing.T) {
	g := startGateway(t, gwOpts{registration: true, rate: 10, proxyHeader: "CF-Connecting-IP"})
	ip := "CF-Connecting-IP: 198.51.100.7"
	a, _, _ := headersOnly(t, g.addr, head("POST", "/register", 4097, ip))
	expect(t, "4097", a, 413, errBody("request body too large"))
	a, _, _ = headersOnly(t, g.addr, head("POST", "/register", 4097, ip, "Expect: 100-continue"))
	expect(t, "4097 with Expect", a, 413, errBody("request body too large"))
	a, _, _ = headersOnly(t, g.addr, head("POST", "/register", 20, "CF-Connecting-IP: not-an-address"))
	expect(t, "no address", a, 503, errBody("registration is temporarily unavailable"))
	a, _, _ = headersOnly(t, g.addr, head("POST", "/register", 4096, ip, "Expect: 100-continue"))
	if a.status != 100 {
		t.Fatalf("4096 with Expect: %d %s, want 100 Continue", a.status, a.body)
	}
	// The 413s spent registration attempts, as the reference's limit
	// comes before its body check: 5 a minute, two spent (the request
	// told to continue spends one only when its body arrives).
	for i := range 3 {
		if a := g.do("POST", "/register", map[string]string{"CF-Connecting-IP": "198.51.100.7"}, strings.NewReader(`{}`)); a.status != 201 {
			t.Fatalf("registration %d: %d %s", i, a.status, a.body)
		}
	}
	a, _, _ = headersOnly(t, g.addr, head("POST", "/register", 4097, ip))
	if a.status != 429 || a.header.Get("Retry-After") != "60" {
		t.Fatalf("4097 past the minute limit: %d %s, want 429 (the limit comes before the body)", a.status, a.body)
	}
}

// A client still writing a body the gateway refused from the headers
// reads the refusal, not a reset: the connection drains the rest of the
// body (bounded) before it closes. 512 KiB is past what the loopback
// socket buffers absorb: without the drain, most runs see "connection
// reset by peer" within the 20 rounds.
func TestRefusedBodyStillBeingWrittenGetsTheAnswer(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100})
	_, key := g.newKey("server")
	big := bytes.Repeat([]byte(" "), 512<<10)
	for i := range 20 {
		a := g.do("POST", "/send", nil, bytes.NewReader(big))
		expect(t, fmt.Sprint("no key, 512 KiB, round ", i), a, 401, errBody("missing api key"))
		a = g.send(key, string(big))
		expect(t, fmt.Sprint("512 KiB, round ", i), a, 413, errBody("request body too large"))
	}
}

// A body whose stream breaks (here a malformed chunk) is 400 "could not
// read request body", as in the reference, on /send and on /register,
// where it mints no key (unparseable JSON would read as {} and mint).
func TestUnreadableBodyRefused(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100, registration: true})
	_, key := g.newKey("server")
	for _, tc := range []struct{ path, auth string }{
		{"/send", "Authorization: Bearer " + key},
		{"/register", "X-Test: 1"},
	} {
		a, _, _ := headersOnly(t, g.addr, head("POST", tc.path, -1, tc.auth)+"zz\r\n{}\r\n0\r\n\r\n")
		expect(t, tc.path, a, 400, errBody("could not read request body"))
	}
	if list, _ := g.keys.List(); len(list) != 1 {
		t.Fatalf("%d keys: a broken /register minted one", len(list))
	}
}

// The listener's note of a withheld body cannot come from the client: a
// valid send that carries it is served, and so is an HTTP/1.0 refusal.
func TestWithheldNoteNotSpoofable(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100})
	_, key := g.newKey("server")
	h := map[string]string{"Authorization": "Bearer " + key, "X-Edgerelay-Withheld-Length": "99999"}
	expect(t, "spoofed note", g.do("POST", "/send", h, strings.NewReader(`{"token":"abc"}`)), 200, `{"ok":true}`)
	h = map[string]string{"Authorization": "Bearer " + key, "X-Edgerelay-Withheld-Length": "1"}
	expect(t, "spoofed note, no body", g.do("POST", "/send", h, nil), 400, errBody("invalid json body"))
	a, closes, _ := headersOnly(t, g.addr, strings.Replace(head("POST", "/send", 500), "HTTP/1.1", "HTTP/1.0", 1))
	expect(t, "HTTP/1.0 without key", a, 401, errBody("missing api key"))
	if !closes {
		t.Error("HTTP/1.0 refusal keeps the connection")
	}
}
