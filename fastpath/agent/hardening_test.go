package agent_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/agent/agenttest"
	"edgerelay/fastpath/ndjson"
)

// hello sends one raw hello on a fresh link and returns the relay's answer.
func (r *relay) hello(t *testing.T, token, line string) agenttest.Frame {
	t.Helper()
	conn, br := r.rawLink(token)
	defer conn.Close()
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("hello %s: no answer: %v", line, err)
	}
	f, err := agenttest.DecodeFrame(raw[:len(raw)-1])
	if err != nil {
		t.Fatalf("answer %q: %v", raw, err)
	}
	return f
}

// TestHelloFieldForms: every field of the hello in its empty, null and
// wrong-typed forms. Only an absent or null nonce means "no nonce"; an
// empty one is a nonce of 0 bytes and refused like one; a version must be
// a JSON integer; the payload must name the token's instance.
func TestHelloFieldForms(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	p := r.pair("acme", "host-1")
	const nonce32 = `"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="`
	line := func(env, version, instance, nonce string) string {
		s := `{"type":"relay.hello"`
		if env != "" {
			s += `,"instance":` + env
		}
		s += `,"id":"hello","payload":{"agent":"raw/1"`
		for _, m := range [][2]string{{"protocol_version", version}, {"instance", instance}, {"nonce", nonce}} {
			if m[1] != "" {
				s += `,"` + m[0] + `":` + m[1]
			}
		}
		return s + `}}`
	}
	id := strconv.Quote(p.id)
	for _, tc := range []struct {
		name                      string
		env, version, inst, nonce string
		code                      string // "" for a welcome
		sig                       bool
	}{
		{"all there", id, "1", id, nonce32, "", true},
		{"no envelope instance", "", "1", id, nonce32, "", true},
		{"nonce absent", id, "1", id, "", "", false},
		{"nonce null", id, "1", id, "null", "", false},
		{"nonce empty", id, "1", id, `""`, "malformed_frame", false},
		{"nonce of 1 byte", id, "1", id, `"AA=="`, "", true},
		{"nonce a number", id, "1", id, "5", "malformed_frame", false},
		{"nonce an array", id, "1", id, "[1]", "malformed_frame", false},
		{"nonce not base64", id, "1", id, `"!!!!"`, "malformed_frame", false},
		{"version a string", id, `"1"`, id, nonce32, "unsupported_version", false},
		{"version null", id, "null", id, nonce32, "unsupported_version", false},
		{"version absent", id, "", id, nonce32, "unsupported_version", false},
		{"version 0", id, "0", id, nonce32, "unsupported_version", false},
		{"version -1", id, "-1", id, nonce32, "unsupported_version", false},
		{"version 1.0", id, "1.0", id, nonce32, "unsupported_version", false},
		{"version huge", id, "123456789012345678901234567890", id, nonce32, "", true},
		{"payload instance empty", id, "1", `""`, nonce32, "unknown_instance", false},
		{"payload instance null", id, "1", "null", nonce32, "unknown_instance", false},
		{"payload instance absent", id, "1", "", nonce32, "unknown_instance", false},
		{"payload instance a number", id, "1", "5", nonce32, "malformed_frame", false},
		{"envelope instance another", `"inst-other"`, "1", id, nonce32, "unknown_instance", false},
		// Keys match as the reference decoder matches them: any case, the
		// last duplicate winning.
		{"NONCE empty", id, "1", id, nonce32 + `,"NONCE":""`, "malformed_frame", false},
		{"nonce empty then good", id, "1", id, `"","nonce":` + nonce32, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := r.hello(t, p.token, line(tc.env, tc.version, tc.inst, tc.nonce))
			if f.Re != "hello" {
				t.Fatalf("answer %s does not answer the hello", f.Raw)
			}
			var pl struct {
				Code            string `json:"code"`
				ProtocolVersion int    `json:"protocol_version"`
				Sig             []byte `json:"sig"`
			}
			if err := json.Unmarshal(f.Payload, &pl); err != nil {
				t.Fatal(err)
			}
			if tc.code != "" {
				if f.Type != "relay.error" || pl.Code != tc.code {
					t.Fatalf("got %s, want relay.error %s", f.Raw, tc.code)
				}
				return
			}
			if f.Type != "relay.welcome" || pl.ProtocolVersion != 1 || (len(pl.Sig) == 64) != tc.sig ||
				strings.Contains(string(f.Raw), `"sig"`) != tc.sig {
				t.Fatalf("got %s, want a welcome (sig %v)", f.Raw, tc.sig)
			}
		})
	}
}

// TestHelloOtherShapes: a hello whose payload is no object, or whose agent
// is of the wrong type, is malformed_frame; an empty agent is fine (it is
// only a name). A hello nested past the scanner's limit is refused with
// re "hello" all the same, so the connector knows what was refused.
func TestHelloOtherShapes(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	p := r.pair("acme", "host-1")
	const nonce32 = `"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="`
	good := `"protocol_version":1,"instance":"` + p.id + `","nonce":` + nonce32
	for _, tc := range []struct{ name, payload, want string }{
		{"payload null", `null`, "unknown_instance"},
		{"payload an array", `[1]`, "malformed_frame"},
		{"payload a string", `"hello"`, "malformed_frame"},
		{"agent a number", `{` + good + `,"agent":5}`, "malformed_frame"},
		{"agent empty", `{` + good + `,"agent":""}`, "relay.welcome"},
		{"agent null", `{` + good + `,"agent":null}`, "relay.welcome"},
		{"nested too deep", `{` + good + `,"x":` + strings.Repeat("[", ndjson.MaxDepth) + strings.Repeat("]", ndjson.MaxDepth) + `}`, "malformed_frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := r.hello(t, p.token, `{"type":"relay.hello","instance":"`+p.id+`","id":"hello","payload":`+tc.payload+`}`)
			var pl struct{ Code string }
			_ = json.Unmarshal(f.Payload, &pl)
			if f.Re != "hello" || (f.Type != tc.want && pl.Code != tc.want) {
				t.Fatalf("got %s, want %s", f.Raw, tc.want)
			}
		})
	}
}

// nested is a client request whose payload nests depth arrays.
func nested(id string, depth int) string {
	return `{"type":"acp.message","id":"` + id + `","payload":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`
}

// TestMalformedRequestsAreAnswered: a client request the relay cannot take
// gets malformed_frame whatever makes it fail: nesting one level past the
// scanner's limit or 20,000 past it (deeper than encoding/json goes), bytes
// after the object, a syntax error after the id, the id after a deep
// value. One level less than the limit is routed. A message whose only id
// is nested is no request, and gets nothing.
func TestMalformedRequestsAreAnswered(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)

	// The top object is level 1, so the payload may nest MaxDepth-1.
	cl.send(nested("deepest", ndjson.MaxDepth-1))
	if f := next(t, c); f.ID != "deepest" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
	for _, tc := range []struct{ msg, re, message string }{
		{`{"type":"acp.message","payload":{"id":"inner"}}]`, "", ""}, // no top-level id: not answered
		{nested("too-deep", ndjson.MaxDepth), "too-deep", "malformed frame: nested deeper than 128 levels"},
		{nested("very-deep", 20_000), "very-deep", "malformed frame: nested deeper than 128 levels"},
		{`{"payload":` + strings.Repeat(`{"a":`, 20_000) + `1` + strings.Repeat("}", 20_000) + `,"type":"acp.message","ID":"id-after"}`, "id-after", ""},
		{`{"type":"acp.message","id":"trailing"}{"type":"b"}`, "trailing", "malformed frame"},
		{`{"type":"acp.message","id":"broken","payload":}`, "broken", "malformed frame"},
		{`{"type":"acp.message","id":"unclosed","payload":[[[`, "unclosed", "malformed frame"},
		{`{"type":5,"id":"typed"}`, "typed", ""},
		{`{"type":"acp.message","id":"first","i\u0064":"last"` + strings.Repeat("[", 200) + `}`, "last", ""},
	} {
		cl.send(tc.msg)
		if tc.re == "" {
			continue
		}
		f := cl.readFrame()
		var pl struct{ Code, Message string }
		_ = json.Unmarshal(f.Payload, &pl)
		if f.Type != "relay.error" || f.Re != tc.re || f.Instance != p.id || f.Session != sess || pl.Code != "malformed_frame" ||
			(tc.message != "" && pl.Message != tc.message) {
			t.Fatalf("answer to %.80s: %s", tc.msg, f.Raw)
		}
	}
	// None of them reached the instance.
	cl.send(`{"type":"acp.message","id":"good"}`)
	if f := next(t, c); f.ID != "good" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
}

// TestBigFramesReachAReadingClient: with the default queues, frames of any
// legal size reach a client that reads, back to back: a 6 MiB frame, then
// two lines at the line limit (16,777,216 bytes with the line feed),
// each arriving while the one before may still be being written.
func TestBigFramesReachAReadingClient(t *testing.T) {
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	cl, sess := r.attachedSession(p, ctok, c)
	frame := func(n int, size int) string {
		head := `{"type":"acp.message","instance":"` + p.id + `","session":"` + sess + `","n":` + strconv.Itoa(n) + `,"pad":"`
		return head + strings.Repeat("p", size-len(head)-len(`"}`)) + `"}`
	}
	sizes := []int{6 << 20, ndjson.MaxLine - 1, ndjson.MaxLine - 1}
	got := make(chan error, 1)
	go func() {
		for i, size := range sizes {
			_ = cl.c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, msg, err := cl.c.ReadMessage()
			if err != nil {
				got <- err
				return
			}
			if len(msg) != size || !strings.Contains(string(msg[:200]), `"n":`+strconv.Itoa(i)+`,`) {
				got <- &mismatch{got: string(msg[:80]), want: "frame " + strconv.Itoa(i)}
				return
			}
		}
		got <- nil
	}()
	for i, size := range sizes {
		if err := c.Send([]byte(frame(i, size))); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("the reading client: %v", err)
	}
	if n := r.counter("edgerelay_agent_frames_dropped_total", "client_overflow"); n != 0 {
		t.Fatalf("%v frames dropped for overflow", n)
	}
}

// TestInstanceBudgetClosesTheSlowest: two clients of one instance stop
// reading, one of them receiving twice as much. Each stays within its own
// queue, but together they reach the instance's budget: the one holding
// the most is closed with 1013 and the instance is told, the other keeps
// everything sent to it and stays attached.
func TestInstanceBudgetClosesTheSlowest(t *testing.T) {
	const clientQueue = 256 << 10
	// The smallest budget there is: one attachment's whole queue
	// (clientQueue plus the largest frame).
	r := startRelay(t, relayOpts{clientQueue: clientQueue, instanceQueue: 1})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	c := r.connect(p)
	big, bigSess := r.attachedSession(p, ctok, c)
	small, smallSess := r.attachedSession(p, ctok, c)

	pad := strings.Repeat("z", 1<<20)
	line := func(sess string, n int) []byte {
		return []byte(`{"type":"acp.message","instance":"` + p.id + `","session":"` + sess + `","n":` + strconv.Itoa(n) + `,"pad":"` + pad + `"}`)
	}
	sentSmall := 0
	var detached []agenttest.Frame
	for i := 0; len(detached) == 0; i++ {
		if i > 200 { // 300 MiB: far past both queues and the kernel's buffers
			t.Fatal("no client was closed")
		}
		for _, l := range [][]byte{line(bigSess, i), line(bigSess, i), line(smallSess, i)} {
			if err := c.Send(l); err != nil {
				t.Fatal(err)
			}
		}
		sentSmall++
		// The relay reads the link in order: once this heartbeat's ack is
		// back, the frames before it were routed.
		if err := c.Send([]byte(`{"type":"relay.heartbeat","instance":"` + p.id + `","id":"sync-` + strconv.Itoa(i) + `"}`)); err != nil {
			t.Fatal(err)
		}
		detached = append(detached, waitAck(t, c, "sync-"+strconv.Itoa(i))...)
	}
	if len(detached) != 1 || detached[0].Session != bigSess {
		t.Fatalf("instance got %d detaches (%.200s), want the one of the client holding the most", len(detached), detached[0].Raw)
	}
	if n := r.counter("edgerelay_agent_slow_clients_closed_total", "instance"); n != 1 {
		t.Fatalf("%v clients closed for the instance's budget", n)
	}
	if code := big.closeCode(); code != 1013 {
		t.Fatalf("the client holding the most closed with %d, want 1013", code)
	}
	// The other lost nothing and is still attached.
	for i := range sentSmall {
		f := small.readFrame()
		if f.Session != smallSess || !strings.Contains(string(f.Raw[:200]), `"n":`+strconv.Itoa(i)+`,`) {
			t.Fatalf("frame %d to the other client: %.200s", i, f.Raw)
		}
	}
	small.send(`{"type":"acp.message","id":"still-here"}`)
	if f := next(t, c); f.ID != "still-here" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
}

// waitAck reads the connector's frames until the relay's ack of the
// heartbeat id and returns the acp.detach frames before it; anything else
// fails t.
func waitAck(t *testing.T, c *agenttest.Connector, id string) []agenttest.Frame {
	t.Helper()
	var detached []agenttest.Frame
	for {
		f := next(t, c)
		switch {
		case f.Type == "relay.ack" && f.Re == id:
			return detached
		case f.Type == "acp.detach":
			detached = append(detached, f)
		default:
			t.Fatalf("instance got %.200s, want the ack of %s", f.Raw, id)
		}
	}
}

// TestLargestClientFrameReachesTheInstance: the largest message a client
// may send (what fits one line once spliced) passes the instance link's
// queue whole; one byte more is refused with 1009 by the WebSocket. (The
// instance is a raw link: the test connector's encoding/json would take
// seconds over 16 MiB under the race detector.)
func TestLargestClientFrameReachesTheInstance(t *testing.T) {
	const spliceRoom = 64 + 6*2*ndjson.MaxIDLen // as in handler.go
	const largest = ndjson.MaxLine - 1 - spliceRoom
	r := startRelay(t, relayOpts{})
	ctok := r.account("acme")
	p := r.pair("acme", "host-1")
	conn, br := r.rawLink(p.token)
	if _, err := conn.Write([]byte(rawHello(p.id))); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if w, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(w, `{"type":"relay.welcome"`) {
		t.Fatalf("welcome %q %v", w, err)
	}
	cl := r.attach(p.id, ctok)
	head := `{"type":"acp.message","id":"big","pad":"`
	msg := head + strings.Repeat("q", largest-len(head)-len(`"}`)) + `"}`
	cl.send(msg)
	line, err := br.ReadBytes('\n')
	if err != nil || len(line) > ndjson.MaxLine || !strings.HasPrefix(string(line), `{"instance":"`+p.id+`","session":"att-`) ||
		!strings.HasSuffix(string(line), msg[1:]+"\n") {
		t.Fatalf("instance got %d bytes (%.100s): %v", len(line), line, err)
	}
	cl.send(msg[:len(head)] + "q" + msg[len(head):])
	if code := cl.closeCode(); code != 1009 {
		t.Fatalf("one byte more: close %d, want 1009", code)
	}
}
