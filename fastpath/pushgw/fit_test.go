package pushgw

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func message(title, body string, kv ...string) *sendMessage {
	m := &sendMessage{token: []byte("tok"), title: []byte(title), body: []byte(body)}
	for i := 0; i+1 < len(kv); i += 2 {
		m.data = append(m.data, dataEntry{key: []byte(kv[i]), val: []byte(kv[i+1])})
	}
	return m
}

func apnsSize(m *sendMessage) int { return apnsPayloadLen(m, apnsCategory(m)) }

// The measures are the lengths of what is written, for any text.
func TestPayloadMeasures(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "é", "€", "\U0001F600", "\"", "\\", "\n", "\x01", "\x7f", "<", "\u2028"}
	text := func() string {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 500 {
		m := message(text(), text(), "aps", text(), "type", "mfa_challenge", text(), text(), text(), text())
		if got, want := apnsSize(m), len(appendAPNsPayload(nil, m, apnsCategory(m))); got != want {
			t.Fatalf("apnsPayloadLen %d, written %d", got, want)
		}
		fcmMsg := appendFCMMessage(nil, m)
		var doc struct {
			Message struct {
				Data json.RawMessage `json:"data"`
			} `json:"message"`
		}
		if err := json.Unmarshal(fcmMsg, &doc); err != nil {
			t.Fatal(err)
		}
		if got, want := fcmDataLen(m), len(doc.Message.Data); got != want {
			t.Fatalf("fcmDataLen %d, written %d", got, want)
		}
		s := []byte(text())
		for max := 0; max < 60; max += 7 {
			c := clipJSON(s, max)
			if !bytes.HasPrefix(s, c) || !utf8.Valid(c) || jsonLen(c)-2 > max {
				t.Fatalf("clipJSON(%q, %d) = %q", s, max, c)
			}
			if len(c) < len(s) {
				next := c[:len(c)+runeLen(s[len(c)])]
				if jsonLen(next)-2 <= max {
					t.Fatalf("clipJSON(%q, %d) = %q stops short", s, max, c)
				}
			}
		}
	}
}

// KyPost's new-mail push repeats the subject in several data values: a
// 700-character subject is over Apple's 4,096 bytes. The longest values
// are cut to one length, the short ones and the alert stay whole.
func TestAPNsPayloadClippedToFit(t *testing.T) {
	subject := strings.Repeat("Quarterly report ", 42)[:700]
	m := message("Alice Example", subject,
		"messageId", "msg-123", "type", "new_mail", "senderName", "Alice Example",
		"emailSubject", subject, "subject", subject, "Keywords", subject, "preview", subject, "snippet", subject, "url", "/read/123")
	before := apnsSize(m)
	if before <= apnsMaxPayload {
		t.Fatalf("test payload of %d bytes fits already", before)
	}
	c := fit(m, apnsMaxPayload, apnsSize, apnsSkips, true)
	payload := appendAPNsPayload(nil, m, apnsCategory(m))
	if c == nil || c.from != before || c.to != len(payload) || len(payload) > apnsMaxPayload || len(payload) < apnsMaxPayload-8 {
		t.Fatalf("clipping %+v, payload %d bytes (from %d)", c, len(payload), before)
	}
	var got map[string]any
	if err := json.Unmarshal(payload, &got); err != nil {
		t.Fatal(err)
	}
	if got["messageId"] != "msg-123" || got["senderName"] != "Alice Example" || got["url"] != "/read/123" || got["type"] != "new_mail" {
		t.Errorf("short values changed: %v", got)
	}
	alert := got["aps"].(map[string]any)["alert"].(map[string]any)
	if alert["body"] != subject || alert["title"] != "Alice Example" {
		t.Errorf("the alert was clipped although the data made room: %v", alert)
	}
	es, kw, pv := got["emailSubject"].(string), got["subject"].(string), got["preview"].(string)
	if len(es) != len(kw) || len(kw) != len(pv) || len(es) >= 700 || !strings.HasPrefix(subject, es) {
		t.Errorf("the longest values are not cut to one length: %d %d %d", len(es), len(kw), len(pv))
	}

	// At the limit nothing changes; one byte past it, something does.
	m = message("", "")
	m.data = []dataEntry{{key: []byte("k"), val: nil}}
	m.data[0].val = bytes.Repeat([]byte("v"), apnsMaxPayload-apnsSize(m))
	if apnsSize(m) != apnsMaxPayload || fit(m, apnsMaxPayload, apnsSize, apnsSkips, true) != nil {
		t.Fatalf("a payload of exactly %d bytes was clipped", apnsMaxPayload)
	}
	m.data[0].val = append(m.data[0].val, 'v')
	if c := fit(m, apnsMaxPayload, apnsSize, apnsSkips, true); c == nil || c.to != apnsMaxPayload {
		t.Fatalf("one byte past: %+v", c)
	}
}

// When the data cannot make room the body goes next, then the title;
// surrogate pairs and escapes are never cut in half.
func TestAPNsBodyThenTitleClipped(t *testing.T) {
	emoji := "\U0001F600"
	m := message(strings.Repeat("\x01", 256), strings.Repeat(emoji, 1000), "a", strings.Repeat("\n", 300), "aps", strings.Repeat("x", 3000))
	c := fit(m, apnsMaxPayload, apnsSize, apnsSkips, true)
	if c == nil || c.to > apnsMaxPayload {
		t.Fatalf("%+v", c)
	}
	if len(m.data[0].val) != 0 || len(m.data[1].val) != 3000 {
		t.Errorf("data: %d bytes left of a, %d of aps (left out of the payload, never clipped)", len(m.data[0].val), len(m.data[1].val))
	}
	if !utf8.Valid(m.body) || len(m.body)%4 != 0 || len(m.body) == 0 {
		t.Errorf("body of %d bytes: a pair was split or all was cut", len(m.body))
	}
	if len(m.title) != 256 {
		t.Errorf("title clipped (%d) although the body made room", len(m.title))
	}
	m = message(strings.Repeat("\x01", 256)+strings.Repeat("t", 3000), strings.Repeat("b", 100))
	if c := fit(m, apnsMaxPayload, apnsSize, apnsSkips, true); c == nil || c.to > apnsMaxPayload || len(m.body) != 0 || len(m.title) == 0 {
		t.Fatalf("%+v: body %d, title %d", c, len(m.body), len(m.title))
	}
}

// FCM: only data values are clipped (title and body are not forwarded).
func TestFCMDataClippedToFit(t *testing.T) {
	subject := strings.Repeat("s", 1024)
	m := message("t", "b", "messageId", "msg-1", "emailSubject", subject, "Keywords", subject, "preview", subject, "more", subject)
	if fcmDataLen(m) <= fcmMaxData {
		t.Fatal("fits already")
	}
	c := fit(m, fcmMaxData, fcmDataLen, skipNone, false)
	if c == nil || fcmDataLen(m) > fcmMaxData || string(m.title) != "t" || string(m.body) != "b" || string(m.data[0].val) != "msg-1" {
		t.Fatalf("%+v: %d bytes, %+v", c, fcmDataLen(m), m)
	}
}
