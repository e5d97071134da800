package channel_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

func TestHealth(t *testing.T) {
	r := startRelay(t, relayOpts{})
	a := r.do("GET", "/health", "", nil)
	mustStatus(t, a, 200, "")
	want := `{"protocol":"botharness-private-v1","protocols":["botharness-private-v1","botharness-private-v2"]}`
	if string(a.raw) != want {
		t.Fatalf("health %s", a.raw)
	}
	mustStatus(t, r.do("GET", "/nope", "", nil), 404, "not found")
}

func TestClaimAnswers(t *testing.T) {
	r := startRelay(t, relayOpts{})
	key := r.addKey("alpha")
	owner, phone := randHex(t), randHex(t)

	mustStatus(t, r.do("POST", "/claim", "", claimBody(owner, phone)), 401, "bearer")
	mustStatus(t, r.do("POST", "/claim", randHex(t), claimBody(owner, phone)), 403, "unknown claim key")

	// Bad bodies answer 400 and leave the key unused.
	for name, body := range map[string][]byte{
		"not json":       []byte("{"),
		"array":          []byte(`[]`),
		"missing phone":  []byte(`{"ownerToken":"` + owner + `"}`),
		"number token":   []byte(`{"ownerToken":1,"phoneToken":"` + phone + `"}`),
		"short token":    claimBody(owner[:63], phone),
		"uppercase":      claimBody(strings.ToUpper(owner), phone),
		"non hex":        claimBody("g"+owner[1:], phone),
		"equal tokens":   claimBody(owner, owner),
		"long token":     claimBody(owner+"0", phone),
		"empty body":     nil,
		"phone not text": []byte(`{"ownerToken":"` + owner + `","phoneToken":null}`),
	} {
		t.Run(name, func(t *testing.T) {
			mustStatus(t, r.do("POST", "/claim", key, body), 400, "")
		})
	}
	// At most 1 KiB: exactly 1024 bytes is read, 1025 is 413.
	pad := func(n int) []byte {
		b := claimBody(owner, phone)
		return append(b[:len(b)-1], []byte(`,"x":"`+strings.Repeat("a", n-len(b)-7)+`"}`)...)
	}
	if len(pad(1025)) != 1025 || len(pad(1024)) != 1024 {
		t.Fatal("pad")
	}
	mustStatus(t, r.do("POST", "/claim", key, pad(1025)), 413, "")

	a := r.do("POST", "/claim", key, pad(1024))
	mustStatus(t, a, 200, "")
	if string(a.raw) != `{"claimed":true,"host":"alpha"}` {
		t.Fatalf("claim body %s", a.raw)
	}
	mustStatus(t, r.do("POST", "/claim", key, claimBody(randHex(t), randHex(t))), 409, "already used")

	// A token already in use anywhere is refused, in either role.
	key2 := r.addKey("beta")
	mustStatus(t, r.do("POST", "/claim", key2, claimBody(owner, randHex(t))), 400, "in use")
	mustStatus(t, r.do("POST", "/claim", key2, claimBody(randHex(t), owner)), 400, "in use")
	mustStatus(t, r.do("POST", "/claim", key2, claimBody(phone, randHex(t))), 400, "in use")
	// ...and the refusal did not spend key2.
	r.claim(key2)
}

func TestStatusAndRelease(t *testing.T) {
	r := startRelay(t, relayOpts{})
	key := r.addKey("alpha")
	c := r.claim(key)
	mustStatus(t, r.do("GET", "/status", randHex(t), nil), 404, "")
	mustStatus(t, r.do("GET", "/status", "", nil), 404, "")
	a := r.do("GET", "/status", c.owner, nil)
	mustStatus(t, a, 200, "")
	if string(a.raw) != `{"connected":false,"host":"alpha"}` {
		t.Fatalf("status %s", a.raw)
	}
	// The phone token is not an owner token.
	mustStatus(t, r.do("GET", "/status", c.phone, nil), 404, "")

	ctl := r.dialHost(c.owner)
	waitFor(t, "connected", func() bool {
		return string(r.do("GET", "/status", c.owner, nil).raw) == `{"connected":true,"host":"alpha"}`
	})
	phone, _ := r.dialPhone(c.phone, ctl)

	mustStatus(t, r.do("DELETE", "/claim", randHex(t), nil), 404, "")
	a = r.do("DELETE", "/claim", c.owner, nil)
	mustStatus(t, a, 200, "")
	if string(a.raw) != `{"released":true}` {
		t.Fatalf("release %s", a.raw)
	}
	if code := closeCode(t, ctl); code != 1000 {
		t.Fatalf("control closed with %d", code)
	}
	if code := closeCode(t, phone); code != 1001 {
		t.Fatalf("phone closed with %d", code)
	}
	mustStatus(t, r.do("GET", "/status", c.owner, nil), 404, "")
	mustStatus(t, r.do("DELETE", "/claim", c.owner, nil), 404, "")
	if _, resp, err := r.dial("/host", bearer(c.owner)); err == nil || resp.StatusCode != 403 {
		t.Fatalf("host after release: %v %v", err, statusOf(resp))
	}
	// The key stays used.
	mustStatus(t, r.do("POST", "/claim", key, claimBody(randHex(t), randHex(t))), 409, "")
	// The released tokens may be used again by another computer.
	key2 := r.addKey("beta")
	mustStatus(t, r.do("POST", "/claim", key2, claimBody(c.owner, c.phone)), 200, "")
}

func TestUpgradeRefusals(t *testing.T) {
	r := startRelay(t, relayOpts{})
	c := r.claim(r.addKey("alpha"))
	refused := func(path string, h http.Header, want int) {
		t.Helper()
		conn, resp, err := r.dial(path, h)
		if err == nil {
			conn.Close()
			t.Fatalf("%s upgraded", path)
		}
		if resp == nil || resp.StatusCode != want {
			t.Fatalf("%s: %v %v", path, err, statusOf(resp))
		}
		if resp.Header.Get("Cache-Control") != "no-store" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s refusal headers %v", path, resp.Header)
		}
	}
	refused("/host", nil, 403)
	refused("/host", bearer(randHex(t)), 403)
	refused("/host", bearer(c.phone), 403)
	// The computer is not connected yet.
	refused("/botharness-device/channel", bearer(c.phone), 403)
	refused("/botharness-device/channel", nil, 403)
	refused("/botharness-device/channel", bearer(c.owner), 403)

	ctl := r.dialHost(c.owner)
	refused("/host", bearer(c.owner), 403) // a second control socket
	// Both admission headers work.
	r.dialPhone(c.phone, ctl)
	p2, _, err := r.dial("/botharness-device/channel", http.Header{"X-Botharness-Admission": {c.phone}})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if m := readControl(t, ctl); m.Type != "open" {
		t.Fatalf("%+v", m)
	}
}

func TestPhoneLimit(t *testing.T) {
	r := startRelay(t, relayOpts{})
	c := r.claim(r.addKey("alpha"))
	ctl := r.dialHost(c.owner)
	phones := make([]*websocket.Conn, 0, 32)
	for range 32 {
		p, _ := r.dialPhone(c.phone, ctl)
		phones = append(phones, p)
	}
	_, resp, err := r.dial("/botharness-device/channel", bearer(c.phone))
	if err == nil || resp.StatusCode != 403 {
		t.Fatalf("33rd phone: %v %v", err, statusOf(resp))
	}
	// One leaves: the computer hears of it and a new phone fits again.
	phones[0].Close()
	if m := readControl(t, ctl); m.Type != "close" {
		t.Fatalf("%+v", m)
	}
	r.dialPhone(c.phone, ctl)
}

func TestForwardingBothWaysAndIsolation(t *testing.T) {
	r := startRelay(t, relayOpts{})
	a := r.claim(r.addKey("alpha"))
	b := r.claim(r.addKey("beta"))
	ctlA, ctlB := r.dialHost(a.owner), r.dialHost(b.owner)
	phoneA, idA := r.dialPhone(a.phone, ctlA)
	phoneB, idB := r.dialPhone(b.phone, ctlB)

	sendText(t, phoneA, "from A")
	sendText(t, phoneB, "from B")
	if m := readControl(t, ctlA); m.Type != "data" || m.ID != idA || *m.Data != "from A" {
		t.Fatalf("computer A got %+v", m)
	}
	if m := readControl(t, ctlB); m.Type != "data" || m.ID != idB || *m.Data != "from B" {
		t.Fatalf("computer B got %+v (A's frame leaked?)", m)
	}
	// Computer A names B's phone: ignored, reaches nobody; A's own frame
	// after it arrives, so the ignored one was not merely slow.
	sendData(t, ctlA, idB, "A to B's phone")
	sendData(t, ctlB, idB, "B to B")
	sendData(t, ctlA, idA, "A to A")
	if got := readText(t, phoneB); got != "B to B" {
		t.Fatalf("phone B got %q", got)
	}
	if got := readText(t, phoneA); got != "A to A" {
		t.Fatalf("phone A got %q", got)
	}
	// An unknown id is ignored and the control socket stays up.
	sendData(t, ctlA, strings.Repeat("0", 32), "nobody")
	sendData(t, ctlA, idA, "still up")
	if got := readText(t, phoneA); got != "still up" {
		t.Fatalf("phone A got %q", got)
	}
}

func TestHardFramesArriveIntact(t *testing.T) {
	r := startRelay(t, relayOpts{})
	c := r.claim(r.addKey("alpha"))
	ctl := r.dialHost(c.owner)
	phone, id := r.dialPhone(c.phone, ctl)
	frames := []string{
		`"quoted" \backslash\ \\ \"`,
		"controls \x00\x01\x07\b\f\n\r\t\x1f\x7f end",
		"non-ASCII: é ü ß 中文 日本語 한국어 \u2028 \u2029 emoji 😀🎉 👨‍👩‍👧",
		"</script><!-- & ' > <",
		"",
	}
	for _, f := range frames {
		sendText(t, phone, f)
		m := readControl(t, ctl)
		if m.Type != "data" || m.ID != id || m.Data == nil || *m.Data != f {
			t.Fatalf("computer got %+v for %q", m, f)
		}
		sendData(t, ctl, id, f)
		if got := readText(t, phone); got != f {
			t.Fatalf("phone got %q want %q", got, f)
		}
	}
	// The computer may write any valid JSON: escapes, surrogate pairs,
	// \/, keys in any order, whitespace.
	raw := ` { "data" : "\u0041\/\ud83d\ude00\n\"" ,"id":"` + id + `",  "type":"d\u0061ta" } `
	if err := ctl.WriteMessage(websocket.TextMessage, []byte(raw)); err != nil {
		t.Fatal(err)
	}
	if got := readText(t, phone); got != "A/😀\n\"" {
		t.Fatalf("phone got %q", got)
	}
}

func TestFrameSizeLimit(t *testing.T) {
	r := startRelay(t, relayOpts{})
	c := r.claim(r.addKey("alpha"))
	ctl := r.dialHost(c.owner)
	phone, id := r.dialPhone(c.phone, ctl)

	edge := strings.Repeat("x", 70000)
	sendText(t, phone, edge)
	if m := readControl(t, ctl); *m.Data != edge {
		t.Fatal("70,000-byte frame changed")
	}
	sendData(t, ctl, id, edge)
	if got := readText(t, phone); got != edge {
		t.Fatal("70,000-byte frame to phone changed")
	}
	// The limit applies to data after unescaping: 70,000 bytes written as
	// \u escapes pass.
	escaped := `{"type":"data","id":"` + id + `","data":"` + strings.Repeat(`\u0078`, 70000) + `"}`
	if err := ctl.WriteMessage(websocket.TextMessage, []byte(escaped)); err != nil {
		t.Fatal(err)
	}
	if got := readText(t, phone); got != edge {
		t.Fatal("escaped 70,000-byte frame changed")
	}

	sendText(t, phone, edge+"x")
	if code := closeCode(t, phone); code != 1009 {
		t.Fatalf("70,001 bytes: close %d, want 1009", code)
	}
	if m := readControl(t, ctl); m.Type != "close" || m.ID != id {
		t.Fatalf("computer got %+v, want close", m)
	}

	// A binary phone frame closes with 1003 and the computer is told.
	phone2, id2 := r.dialPhone(c.phone, ctl)
	if err := phone2.WriteMessage(websocket.BinaryMessage, []byte("bin")); err != nil {
		t.Fatal(err)
	}
	if code := closeCode(t, phone2); code != 1003 {
		t.Fatalf("binary: close %d, want 1003", code)
	}
	if m := readControl(t, ctl); m.Type != "close" || m.ID != id2 {
		t.Fatalf("computer got %+v, want close", m)
	}

	// data over 70,000 bytes from the computer closes the control socket.
	phone3, id3 := r.dialPhone(c.phone, ctl)
	sendData(t, ctl, id3, edge+"x")
	if code := closeCode(t, ctl); code != 1008 {
		t.Fatalf("oversized data: control closed %d", code)
	}
	if code := closeCode(t, phone3); code != 1001 {
		t.Fatalf("phone closed %d, want 1001", code)
	}
}

func TestMalformedControlFrames(t *testing.T) {
	r := startRelay(t, relayOpts{})
	c := r.claim(r.addKey("alpha"))
	id := strings.Repeat("a", 32)
	cases := map[string][]byte{
		"not json":        []byte(`{"type":"data"`),
		"not an object":   []byte(`["data"]`),
		"string":          []byte(`"data"`),
		"unknown type":    []byte(`{"type":"ping","id":"` + id + `"}`),
		"open from host":  []byte(`{"type":"open","id":"` + id + `"}`),
		"missing type":    []byte(`{"id":"` + id + `","data":"x"}`),
		"missing id":      []byte(`{"type":"close"}`),
		"short id":        []byte(`{"type":"close","id":"` + id[:31] + `"}`),
		"uppercase id":    []byte(`{"type":"close","id":"` + strings.ToUpper(id) + `"}`),
		"id not string":   []byte(`{"type":"close","id":12}`),
		"data not string": []byte(`{"type":"data","id":"` + id + `","data":7}`),
		"data missing":    []byte(`{"type":"data","id":"` + id + `"}`),
		"trailing":        []byte(`{"type":"close","id":"` + id + `"} x`),
		"binary":          nil,
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			ctl := r.dialHost(c.owner)
			phone, _ := r.dialPhone(c.phone, ctl)
			op := websocket.TextMessage
			if frame == nil {
				op, frame = websocket.BinaryMessage, []byte(`{"type":"close","id":"`+id+`"}`)
			}
			if err := ctl.WriteMessage(op, frame); err != nil {
				t.Fatal(err)
			}
			if code := closeCode(t, ctl); code != 1008 {
				t.Fatalf("control closed %d, want 1008", code)
			}
			if code := closeCode(t, phone); code != 1001 {
				t.Fatalf("phone closed %d, want 1001", code)
			}
			waitFor(t, "control socket gone", func() bool { return !r.h.Connected(hashOf(r.keyOf("alpha"))) })
		})
	}
}

func (r *relay) keyOf(host string) string { return r.hostKeys[host] }

func TestComputerCloseAndOffline(t *testing.T) {
	r := startRelay(t, relayOpts{})
	a := r.claim(r.addKey("alpha"))
	b := r.claim(r.addKey("beta"))
	ctlA, ctlB := r.dialHost(a.owner), r.dialHost(b.owner)
	phoneA, idA := r.dialPhone(a.phone, ctlA)
	phoneB, idB := r.dialPhone(b.phone, ctlB)

	// The computer's own close: phone gets 1000, the computer no close.
	closeMsg, _ := json.Marshal(map[string]string{"type": "close", "id": idA})
	if err := ctlA.WriteMessage(websocket.TextMessage, closeMsg); err != nil {
		t.Fatal(err)
	}
	if code := closeCode(t, phoneA); code != 1000 {
		t.Fatalf("phone closed %d, want 1000", code)
	}
	phoneA2, idA2 := r.dialPhone(a.phone, ctlA)
	if idA2 == idA {
		t.Fatal("channel id reused")
	}
	// The next thing A hears is the new phone's frame, not a close for idA.
	sendText(t, phoneA2, "hello")
	if m := readControl(t, ctlA); m.Type != "data" || m.ID != idA2 {
		t.Fatalf("computer got %+v", m)
	}

	// Computer A goes offline: its phones close with 1001, B keeps working.
	ctlA.Close()
	if code := closeCode(t, phoneA2); code != 1001 {
		t.Fatalf("phone A closed %d, want 1001", code)
	}
	sendText(t, phoneB, "B still")
	if m := readControl(t, ctlB); m.ID != idB || *m.Data != "B still" {
		t.Fatalf("%+v", m)
	}
	sendData(t, ctlB, idB, "B back")
	if got := readText(t, phoneB); got != "B back" {
		t.Fatal(got)
	}
	// A may reconnect.
	waitFor(t, "A gone", func() bool { return strings.Contains(string(r.do("GET", "/status", a.owner, nil).raw), "false") })
	r.dialHost(a.owner)
}

func TestSlowPhoneDroppedOthersFlow(t *testing.T) {
	r := startRelay(t, relayOpts{maxQueue: 256 << 10})
	c := r.claim(r.addKey("alpha"))
	ctl := r.dialHost(c.owner)
	// The frozen phone never reads; its TCP buffers fill, then its queue.
	_, frozenID := r.dialPhone(c.phone, ctl)
	live, liveID := r.dialPhone(c.phone, ctl)

	// gorilla allows one writer at a time on ctl.
	var wmu sync.Mutex
	write := func(id, data string) error {
		b, _ := json.Marshal(map[string]string{"type": "data", "id": id, "data": data})
		wmu.Lock()
		defer wmu.Unlock()
		return ctl.WriteMessage(websocket.TextMessage, b)
	}
	big := strings.Repeat("z", 60000)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if write(frozenID, big) != nil {
				return
			}
		}
	}()
	// Meanwhile the live phone keeps getting its frames.
	for i := range 20 {
		msg := "live " + strings.Repeat("y", i)
		if err := write(liveID, msg); err != nil {
			t.Fatal(err)
		}
		if got := readText(t, live); got != msg {
			t.Fatalf("live phone got %q", got)
		}
	}
	// The frozen phone is dropped and the computer is told.
	for {
		m := readControl(t, ctl)
		if m.Type == "close" && m.ID == frozenID {
			break
		}
	}
	close(done)
	wg.Wait()
	if err := write(liveID, "after"); err != nil {
		t.Fatal(err)
	}
	if got := readText(t, live); got != "after" {
		t.Fatalf("live phone got %q", got)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSilentSocketsDroppedByPings(t *testing.T) {
	r := startRelay(t, relayOpts{ping: 100 * time.Millisecond})
	c := r.claim(r.addKey("alpha"))
	ctl := r.dialHost(c.owner)
	// gorilla answers pings only while something reads: this phone never
	// reads, so it never answers.
	_, silentID := r.dialPhone(c.phone, ctl)
	live, liveID := r.dialPhone(c.phone, ctl)
	liveDone := make(chan struct{})
	go func() { // the live phone reads, and so answers every ping
		defer close(liveDone)
		for {
			if _, _, err := live.ReadMessage(); err != nil {
				return
			}
		}
	}()
	// The control socket is read by readControl, which answers its pings.
	start := time.Now()
	m := readControl(t, ctl)
	if m.Type != "close" || m.ID != silentID {
		t.Fatalf("computer got %+v, want close of the silent phone", m)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("dropped after %v, before a ping could go unanswered", waited)
	}
	// The live phone and the control socket are still up after several
	// more intervals: a frame still crosses.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		sendText(t, live, "tick")
		if m := readControl(t, ctl); m.ID != liveID || *m.Data != "tick" {
			t.Fatalf("computer got %+v", m)
		}
	}
	live.Close()
	<-liveDone
}
