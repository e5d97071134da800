package agent_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/agent/agenttest"
	"edgerelay/fastpath/ndjson"
)

// TestRoutedLinesAreByteIdentical: what the instance sends reaches the
// client as the same bytes, unknown fields, odd spacing and escapes
// included; the relay never decodes and re-encodes.
func TestRoutedLinesAreByteIdentical(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)

	lines := []string{
		`{"type":"acp.message","instance":"` + p.id + `","session":"` + sess + `","future_field":{"a":[1,2.50,1e3,true,null]},"payload":{"z":1,"a":"\u00e9\ud83d\ude00"}}`,
		`{ "payload" : "x" ,	"session":"` + sess + `" , "type" : "acp.message", "instance":"` + p.id + `" , "seq": 18446744073709551615, "trace":"Ab-_9" }`,
		// The session written with escapes is the same session.
		`{"type":"acp.message","instance":"` + p.id + `","session":"` + escapeAll(sess) + `","x":"<&>"}`,
		// Keys match case-insensitively, and the last duplicate wins, as
		// in the endpoint's decoder.
		`{"TYPE":"acp.message","Instance":"` + p.id + `","session":"nobody","SESSION":"` + sess + `"}`,
	}
	for _, line := range lines {
		if err := c.Send([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if got := cl.read(); string(got) != line {
			t.Fatalf("client got\n%s\nwant\n%s", got, line)
		}
	}
}

// escapeAll writes every byte of s as a \u escape.
func escapeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteString(`\u00`)
		b.WriteByte("0123456789abcdef"[s[i]>>4])
		b.WriteByte("0123456789abcdef"[s[i]&15])
	}
	return b.String()
}

// TestInstanceLinesThatAreDropped: every validation rule of the spec, and
// routing on (instance, session) only. Each bad line is dropped and the
// link lives on: the good line after it arrives.
func TestInstanceLinesThatAreDropped(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	other := r.pair("acme", "host-2")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)
	env := func(fields string) string {
		return `{"instance":"` + p.id + `","session":"` + sess + `",` + fields + `}`
	}
	long := func(n int) string { return strings.Repeat("a", n) }
	bad := map[string]string{
		"no session (ask.published)": `{"type":"ask.published","instance":"` + p.id + `"}`,
		"unknown session":            `{"type":"acp.message","instance":"` + p.id + `","session":"att-nobody"}`,
		"another instance":           `{"type":"acp.message","instance":"` + other.id + `","session":"` + sess + `"}`,
		"session without instance":   `{"type":"acp.message","session":"` + sess + `"}`,
		"no type":                    env(`"id":"1"`),
		"empty type":                 env(`"type":""`),
		"type not a string":          env(`"type":5`),
		"type of 129 bytes":          env(`"type":"` + long(129) + `"`),
		"id of 257 bytes":            env(`"type":"a","id":"` + long(257) + `"`),
		"re of 257 bytes":            env(`"type":"a","re":"` + long(257) + `"`),
		"control char in id":         env(`"type":"a","id":"x\u0001"`),
		"DEL in type":                env(`"type":"a` + "\x7f" + `"`),
		"escaped DEL in re":          env(`"type":"a","re":"\u007f"`),
		"lone surrogate in id":       env(`"type":"a","id":"\ud800"`),
		"invalid UTF-8":              env(`"type":"a","x":"` + "\xff" + `"`),
		"id and re":                  env(`"type":"a","id":"1","re":"2"`),
		"trace with a dot":           env(`"type":"a","trace":"a.b"`),
		"trace of 129 bytes":         env(`"type":"a","trace":"` + long(129) + `"`),
		"negative seq":               env(`"type":"a","seq":-1`),
		"fractional seq":             env(`"type":"a","seq":1.0`),
		"seq of 2^64":                env(`"type":"a","seq":18446744073709551616`),
		"seq as a string":            env(`"type":"a","seq":"1"`),
		"not an object":              `["type","acp.message"]`,
		"two objects":                env(`"type":"a"`) + env(`"type":"a"`),
		"syntax error":               env(`"type":"a",`),
		"trailing garbage":           env(`"type":"a"`) + ` x`,
		"nested too deep":            env(`"type":"a","payload":` + strings.Repeat("[", 200) + strings.Repeat("]", 200)),
	}
	for name, line := range bad {
		if err := c.Send([]byte(line)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// The limits themselves pass.
	good := []string{
		env(`"type":"` + long(128) + `","id":"` + long(256) + `","trace":"` + long(128) + `","seq":18446744073709551615`),
		env(`"type":"ok","re":"` + long(256) + `"`),
	}
	for _, line := range good {
		if err := c.Send([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	for _, line := range good {
		if got := cl.read(); string(got) != line {
			t.Fatalf("client got %.200s\nwant %.200s", got, line)
		}
	}
	cl.quiet(200 * time.Millisecond)
	select {
	case <-c.Done():
		t.Fatalf("the link ended: %v", c.Err())
	default:
	}
	dropped := 0.0
	for _, reason := range []string{"link_malformed", "no_session", "unknown_session", "wrong_instance"} {
		dropped += r.counter("edgerelay_agent_frames_dropped_total", reason)
	}
	if int(dropped) != len(bad) {
		t.Fatalf("%v drops counted, want %d", dropped, len(bad))
	}
}

// TestLineFraming: blank and whitespace-only lines are skipped, one CR
// before the LF is stripped, a line of exactly 16,777,216 bytes (its LF
// included) passes, one more byte closes the link, and a last line
// without its LF is a truncated frame that is not routed.
func TestLineFraming(t *testing.T) {
	r := startRelay(t, relayOpts{clientQueue: 40 << 20, maxClientMessage: 1 << 20})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)
	frame := func(extra string) string {
		return `{"type":"acp.message","instance":"` + p.id + `","session":"` + sess + `"` + extra + `}`
	}

	one := frame(`,"n":1`)
	two := frame(`,"n":2`)
	if err := c.SendRaw([]byte("\n   \n\t\r\n" + one + "\r\n\r\n" + two + "\n")); err != nil {
		t.Fatal(err)
	}
	if got := cl.read(); string(got) != one {
		t.Fatalf("after blanks, CRLF: %q", got)
	}
	if got := cl.read(); string(got) != two {
		t.Fatalf("second: %q", got)
	}

	// Exactly the limit: the line and its LF are 16,777,216 bytes.
	head := frame(`,"pad":"`)
	pad := ndjson.MaxLine - 1 - len(head) - len(`"}`)
	exact := head + strings.Repeat("p", pad) + `"}`
	if len(exact)+1 != 16_777_216 {
		t.Fatalf("test line is %d bytes", len(exact)+1)
	}
	if err := c.Send([]byte(exact)); err != nil {
		t.Fatal(err)
	}
	if got := cl.read(); !bytes.Equal(got, []byte(exact)) {
		t.Fatalf("the line at the limit arrived as %d bytes", len(got))
	}
	// With a CR before the LF the same content is one byte over.
	// The relay may close the link before the last bytes are written:
	// the write's outcome does not matter, the link's end does.
	over := exact + "\r"
	_ = c.Send([]byte(over))
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("a line one byte over the limit did not close the link")
	}
	waitFor(t, "the link's end counted", func() bool {
		return r.counter("edgerelay_agent_links_closed_total", "line_too_long") == 1
	})
	cl.quiet(200 * time.Millisecond)

	// Truncated: a last line without LF is not routed.
	c2 := r.connect(p)
	waitFor(t, "reconnect", func() bool { return r.h.Connected(p.id) })
	cl2 := r.attach(p.id, ctok)
	cl2.send(`{"type":"acp.message","id":"who"}`)
	sess2 := next(t, c2).Session
	if err := c2.SendRaw([]byte(`{"type":"acp.message","instance":"` + p.id + `","session":"` + sess2 + `"}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	_ = c2.Close()
	cl2.quiet(300 * time.Millisecond)
	waitFor(t, "the truncated end counted", func() bool {
		return r.counter("edgerelay_agent_links_closed_total", "truncated") == 1
	})
}

// TestClientFramesAreSpliced: the relay sets instance and session on every
// client frame (a client cannot address another instance or session) and
// leaves every other byte as it was.
func TestClientFramesAreSpliced(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	other := r.pair("acme", "host-2")
	c := r.connect(p)
	cOther := r.connect(other)
	cl, sess := r.attachedSession(p, ctok, c)
	_, otherSess := r.attachedSession(p, ctok, c)

	msg := `{"type":"acp.message","future":[1, 2],"instance":"` + other.id + `","session":"` + otherSess + `","Session":"x","id":"r1","payload":{"jsonrpc":"2.0"}}`
	cl.send(msg)
	f := next(t, c)
	want := `{"instance":"` + p.id + `","session":"` + sess + `","type":"acp.message","future":[1, 2],"id":"r1","payload":{"jsonrpc":"2.0"}}`
	if string(f.Raw) != want {
		t.Fatalf("instance got\n%s\nwant\n%s", f.Raw, want)
	}
	nothing(t, cOther, 200*time.Millisecond)
}

// TestClientMessagesThatAreDropped: a message that is not one JSON object
// on one line never reaches the link; a request among them is answered
// malformed_frame.
func TestClientMessagesThatAreDropped(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)
	for _, tc := range []struct{ msg, re string }{
		{"{\"type\":\"acp.message\",\n\"id\":\"nl\"}", "nl"},            // raw LF as whitespace
		{"{\"type\":\"acp.message\",\r\"id\":\"cr\"}", "cr"},            // raw CR as whitespace
		{"{\"type\":\"acp.message\",\"id\":\"s\",\"x\":\"a\nb\"}", "s"}, // raw LF in a string
		{`{"type":"acp.message","id":"both","re":"x"}`, "both"},
		{`{"type":"acp.message","id":"t","trace":"no spaces"}`, "t"},
		{`{"type":"acp.message","id":"two"}{"type":"b"}`, ""},
		{`[{"type":"acp.message","id":"arr"}]`, ""},
		{`not json`, ""},
		{`{"type":"acp.message","id":"` + strings.Repeat("i", 257) + `"}`, ""}, // an id that cannot be a re
	} {
		cl.send(tc.msg)
		if tc.re == "" {
			continue
		}
		f := cl.readFrame()
		if f.Type != "relay.error" || f.Re != tc.re || f.Instance != p.id || f.Session != sess ||
			!strings.Contains(string(f.Payload), `"code":"malformed_frame"`) {
			t.Fatalf("answer to %q: %s", tc.msg, f.Raw)
		}
	}
	// None reached the instance; the next good one does.
	cl.send(`{"type":"acp.message","id":"good"}`)
	if f := next(t, c); f.ID != "good" {
		t.Fatalf("instance got %s", f.Raw)
	}
	// Binary messages end the attachment.
	if err := cl.c.WriteMessage(2, []byte(`{"type":"a"}`)); err != nil {
		t.Fatal(err)
	}
	if code := cl.closeCode(); code != 1003 {
		t.Fatalf("binary message: close %d", code)
	}
}

// TestClientControl: a client's relay.* frames are for the relay, never
// forwarded: heartbeats are acked, unknown requests answered.
func TestClientControl(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)
	cl.send(`{"type":"relay.heartbeat"}`)
	cl.send(`{"type":"relay.ack","re":"x"}`)
	cl.send(`{"type":"relay.heartbeat","id":"hb1"}`)
	if got := string(cl.read()); got != `{"type":"relay.ack","instance":"`+p.id+`","session":"`+sess+`","re":"hb1"}` {
		t.Fatalf("ack %s", got)
	}
	cl.send(`{"type":"relay.shutdown","id":"q"}`)
	want := `{"type":"relay.error","instance":"` + p.id + `","session":"` + sess + `","re":"q","payload":{"code":"unsupported_type","message":"unsupported message type relay.shutdown"}}`
	if got := string(cl.read()); got != want {
		t.Fatalf("answer %s", got)
	}
	nothing(t, c, 200*time.Millisecond)
}

// TestClientsAreIsolated: two clients of one instance never see each
// other's frames, and a client attaches to its own account's instances
// only.
func TestClientsAreIsolated(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	otherTok := r.account("globex")
	p := r.pair("acme", "host-1")
	q := r.pair("globex", "host-9")
	c := r.connect(p)
	a, sessA := r.attachedSession(p, ctok, c)
	b, sessB := r.attachedSession(p, ctok, c)
	if sessA == sessB {
		t.Fatal("two attachments share a session")
	}
	for i := range 20 {
		to := sessA
		if i%2 == 1 {
			to = sessB
		}
		line := `{"type":"acp.message","instance":"` + p.id + `","session":"` + to + `","n":` + string(rune('0'+i%10)) + `}`
		if err := c.Send([]byte(line)); err != nil {
			t.Fatal(err)
		}
		got := a
		if to == sessB {
			got = b
		}
		if m := got.read(); string(m) != line {
			t.Fatalf("got %s want %s", m, line)
		}
	}
	a.quiet(100 * time.Millisecond)
	b.quiet(100 * time.Millisecond)

	// Another account's instance, an unknown one, and a bad token.
	for _, tc := range []struct {
		id, tok string
		status  int
	}{{q.id, ctok, 403}, {p.id, otherTok, 403}, {"inst-nope", ctok, 403}, {p.id, "bad", 401}, {p.id, "", 401}} {
		hdr := bearer(tc.tok)
		if tc.tok == "" {
			hdr = nil
		}
		_, resp, err := r.dialAttach(tc.id, hdr, nil)
		if err == nil || resp == nil || resp.StatusCode != tc.status {
			t.Errorf("attach %s: %v %v, want %d", tc.id, err, statusOf(resp), tc.status)
		}
	}
}

// TestBrowserBearerSubprotocol: a browser passes its token as a second
// subprotocol; only contenox-relay.v1 is echoed.
func TestBrowserBearerSubprotocol(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	conn, resp, err := r.dialAttach(p.id, nil, []string{"contenox-relay.v1", "bearer." + ctok})
	if err != nil {
		t.Fatalf("%v %v", err, statusOf(resp))
	}
	defer conn.Close()
	if got := resp.Header.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != "contenox-relay.v1" {
		t.Fatalf("echoed %q", got)
	}
	if _, resp, err := r.dialAttach(p.id, nil, []string{"contenox-relay.v1", "bearer.wrong"}); err == nil || resp.StatusCode != 401 {
		t.Fatalf("wrong bearer subprotocol: %v", statusOf(resp))
	}
}

// TestAttachmentLimit: 64 attachments per instance; the 65th is 429, and
// a place freed is a place usable again.
func TestAttachmentLimit(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	var clients []*client
	for range 64 {
		clients = append(clients, r.attach(p.id, ctok))
	}
	waitFor(t, "64 attachments registered", func() bool { return r.h.Attachments(p.id) == 64 })
	_, resp, err := r.dialAttach(p.id, bearer(ctok), []string{"contenox-relay.v1"})
	if err == nil || resp == nil || resp.StatusCode != 429 {
		t.Fatalf("65th attachment: %v %v", err, statusOf(resp))
	}
	clients[0].c.Close()
	waitFor(t, "a freed place", func() bool { return r.h.Attachments(p.id) == 63 })
	r.attach(p.id, ctok)
}

// TestDetachAndOffline: a client that leaves is announced with acp.detach;
// clients stay attached while the instance is offline, their requests
// answered unknown_instance, and forwarding resumes when it reconnects.
func TestDetachAndOffline(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	leaving, sess := r.attachedSession(p, ctok, c)
	stay, staySess := r.attachedSession(p, ctok, c)
	leaving.c.Close()
	f := next(t, c)
	if string(f.Raw) != `{"type":"acp.detach","instance":"`+p.id+`","session":"`+sess+`"}` {
		t.Fatalf("detach %s", f.Raw)
	}

	_ = c.Close()
	waitFor(t, "offline", func() bool { return !r.h.Connected(p.id) })
	stay.send(`{"type":"acp.message","id":"while-offline"}`)
	want := `{"type":"relay.error","instance":"` + p.id + `","session":"` + staySess + `","re":"while-offline","payload":{"code":"unknown_instance","message":"the instance is offline"}}`
	if got := string(stay.read()); got != want {
		t.Fatalf("offline answer %s", got)
	}
	stay.send(`{"type":"acp.message"}`) // a notification: dropped without answer

	c2 := r.connect(p)
	waitFor(t, "online", func() bool { return r.h.Connected(p.id) })
	stay.send(`{"type":"acp.message","id":"back"}`)
	if f := next(t, c2); f.ID != "back" || f.Session != staySess {
		t.Fatalf("after reconnect: %s", f.Raw)
	}
	if err := c2.Send([]byte(`{"type":"acp.message","instance":"` + p.id + `","session":"` + staySess + `","re":"back"}`)); err != nil {
		t.Fatal(err)
	}
	if f := stay.readFrame(); f.Re != "back" {
		t.Fatalf("client got %s", f.Raw)
	}
}

// TestRevokeAndDrain: revoking closes the live link and the clients, and
// the token stops working; a drain closes clients with 1001.
func TestRevokeAndDrain(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	q := r.pair("acme", "host-2")
	c := r.connect(p)
	cl, _ := r.attachedSession(p, ctok, c)
	if err := r.keys.RevokeInstance(p.id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("revoked link still open")
	}
	if code := cl.closeCode(); code != 1008 {
		t.Fatalf("client of a revoked instance: close %d", code)
	}
	list, err := r.keys.Instances()
	if err != nil || len(list) != 2 {
		t.Fatalf("instances %+v %v", list, err)
	}
	for _, in := range list {
		if in.ID == p.id && (!in.Revoked || in.Connected) {
			t.Fatalf("revoked instance listed as %+v", in)
		}
	}

	cq := r.connect(q)
	clq, _ := r.attachedSession(q, ctok, cq)
	r.stop()
	if code := clq.closeCode(); code != 1001 {
		t.Fatalf("drain: close %d", code)
	}
	select {
	case <-cq.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("drained link still open")
	}
	if _, err := agenttest.Dial(t.Context(), r.connOpts(q)); err == nil {
		t.Fatal("link accepted after the drain")
	}
}

// TestClientMessageLimit: a message beyond MaxClientMessage closes the
// client with 1009.
func TestClientMessageLimit(t *testing.T) {
	r := startRelay(t, relayOpts{maxClientMessage: 1000})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, _ := r.attachedSession(p, ctok, c)
	cl.send(`{"type":"a","x":"` + strings.Repeat("x", 1000) + `"}`)
	if code := cl.closeCode(); code != 1009 {
		t.Fatalf("close %d", code)
	}
}
