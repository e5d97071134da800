package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgerelay/sdk/link"
)

// crossIn is what Go hands test/node/cross.mjs: a link code, the access
// token Go derives from it, envelopes (p2c) to feed in order to one
// EnvelopeReader, and streams of signal frames (p2c) each for a fresh
// SignalOpener. Every item carries what Go's own Reader/SignalReceiver said
// of it (expect, and the reader's floor after it), so the JS side must
// agree with Go's rules, not only open what Go seals.
type crossIn struct {
	Code        string        `json:"code"`
	AccessToken string        `json:"accessToken"`
	Envelopes   []crossItem   `json:"envelopes"`
	Signals     [][]crossItem `json:"signals"`
}

type crossItem struct {
	Hex          string `json:"hex"`
	Seq          uint64 `json:"seq"`
	PlaintextHex string `json:"plaintext_hex"`
	// Expect is "ok", "replay", "bad_tag", "malformed" or "stale": the
	// SealError code JS must answer, as Go's error.
	Expect string `json:"expect"`
	// Floor is the Go Reader's floor after this envelope (envelopes only).
	Floor uint64 `json:"floor"`
}

// crossOut is what cross.mjs writes back: its view of the link, envelopes
// (c2p) and signal frames (c2p) it sealed, and a link it generated itself.
type crossOut struct {
	Code        string       `json:"code"`
	AccessToken string       `json:"accessToken"`
	Envelopes   []crossPlain `json:"envelopes"`
	Signals     []crossPlain `json:"signals"`
	Generated   struct {
		Code        string `json:"code"`
		AccessToken string `json:"accessToken"`
		Envelope    string `json:"envelope"` // seq 1, p2c, plaintext "generated"
	} `json:"generated"`
}

type crossPlain struct {
	Hex          string `json:"hex"`
	Seq          uint64 `json:"seq"`
	PlaintextHex string `json:"plaintext_hex"`
}

// TestCrossGoJS: envelopes and signal frames sealed by the Go SDK open in
// the JS SDK with the same verdicts (replays, forgeries, the window, stale
// frames), and what the JS SDK seals opens in Go, byte-identical to what Go
// seals for the same sequence and plaintext. No relay: the two SDKs meet
// through two files.
func TestCrossGoJS(t *testing.T) {
	l, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	code := l.ID + "." + base64.RawURLEncoding.EncodeToString(l.Key[:])
	in := crossIn{Code: code, AccessToken: l.AccessToken()}
	in.Envelopes = crossEnvelopes(t, l)
	in.Signals = crossSignals(t, l)

	dir := t.TempDir()
	inPath, outPath := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json")
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	runNode(t, nil, "test/node/cross.mjs", inPath, outPath)

	raw, err = os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	var out crossOut
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("decode %s: %v", outPath, err)
	}
	if out.Code != code {
		t.Errorf("JS toCode = %q, want %q", out.Code, code)
	}
	if out.AccessToken != l.AccessToken() {
		t.Errorf("JS access token = %q, Go's %q", out.AccessToken, l.AccessToken())
	}
	checkJSEnvelopes(t, l, out.Envelopes)
	checkJSSignals(t, l, out.Signals)
	checkJSGenerated(t, out)
}

// sealer returns a Sealer for key or fails the test.
func sealer(t *testing.T, key [link.KeySize]byte) *link.Sealer {
	t.Helper()
	s, err := link.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// sealErrorCode is the JS SealError code of an error of sdk/link.
func sealErrorCode(t *testing.T, err error) string {
	t.Helper()
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, link.ErrMalformed):
		return "malformed"
	case errors.Is(err, link.ErrBadTag):
		return "bad_tag"
	case errors.Is(err, link.ErrReplay):
		return "replay"
	case errors.Is(err, link.ErrStale):
		return "stale"
	}
	t.Fatalf("unexpected error %v", err)
	return ""
}

// crossEnvelopes seals a p2c stream with every case of the Reader: in
// order, empty and 65,511-byte (a 64 KiB envelope) plaintexts, a replay, out
// of order, a jump past the window (sequence 2^32, which also crosses the
// 32-bit halves of the header), a sequence given up, a forgery before its
// genuine envelope, the other direction's key, malformed envelopes and the
// largest sequence JS handles. Go's Reader decides every expect and floor.
func crossEnvelopes(t *testing.T, l link.Link) []crossItem {
	s := sealer(t, l.EnvelopeKey(link.P2C))
	wrong := sealer(t, l.EnvelopeKey(link.C2P))
	r, err := link.NewReader(l.EnvelopeKey(link.P2C), 0)
	if err != nil {
		t.Fatal(err)
	}
	var items []crossItem
	add := func(env []byte, seq uint64, pt []byte, want string) {
		t.Helper()
		got, opened, err := r.Accept(nil, env)
		c := sealErrorCode(t, err)
		if c != want {
			t.Fatalf("Go Reader on seq %d: %s (%v), this test expects %s", seq, c, err, want)
		}
		if err == nil && (got != seq || !bytes.Equal(opened, pt)) {
			t.Fatalf("Go Reader opened seq %d as %d", seq, got)
		}
		items = append(items, crossItem{Hex: hex.EncodeToString(env), Seq: seq, PlaintextHex: hex.EncodeToString(pt), Expect: c, Floor: r.Floor()})
	}
	seal := func(s *link.Sealer, seq uint64, pt []byte) []byte {
		t.Helper()
		env, err := s.Seal(nil, seq, pt)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	big := randomBytes(t, 65536-link.Overhead)
	const two32 = uint64(1) << 32
	const maxSafe = uint64(1)<<53 - 1
	add(seal(s, 1, []byte("hello")), 1, []byte("hello"), "ok")
	add(seal(s, 2, nil), 2, []byte{}, "ok")
	add(seal(s, 1, []byte("hello")), 1, []byte("hello"), "replay")
	add(seal(s, 4, big), 4, big, "ok")
	add(seal(s, 3, []byte("three")), 3, []byte("three"), "ok")
	add(seal(s, two32, []byte("2^32")), two32, []byte("2^32"), "ok")
	add(seal(s, two32-link.ReplayWindow+10, []byte("inside")), two32-link.ReplayWindow+10, []byte("inside"), "ok")
	add(seal(s, 5, []byte("given up")), 5, []byte("given up"), "replay")
	forged := seal(s, two32+1, []byte("genuine"))
	forged[link.HeaderSize+2] ^= 0x40
	add(forged, two32+1, []byte("genuine"), "bad_tag")
	add(seal(s, two32+1, []byte("genuine")), two32+1, []byte("genuine"), "ok")
	add(seal(wrong, two32+2, []byte("c2p key")), two32+2, []byte("c2p key"), "bad_tag")
	short := seal(s, two32+3, nil)[:link.Overhead-1]
	add(short, two32+3, []byte{}, "malformed")
	v2 := seal(s, two32+4, []byte("v2"))
	v2[0] = 2
	add(v2, two32+4, []byte("v2"), "malformed")
	add(seal(s, maxSafe, big[:1000]), maxSafe, big[:1000], "ok")
	return items
}

// crossSignals seals p2c signal frames with the real clock: a stream with
// frames of one millisecond (consecutive counters), replays, a forgery and
// the largest frame the relay forwards; and a stream of frames from clocks
// six minutes off either way (stale, far from the 5-minute edge so that the
// seconds between this and Node's run do not matter) before an honest one.
func crossSignals(t *testing.T, l link.Link) [][]crossItem {
	key := l.SignalKey(link.P2C)
	stream := func(frames [][]byte, pts [][]byte, want []string) []crossItem {
		t.Helper()
		rcv, err := link.NewSignalReceiver(key, nil)
		if err != nil {
			t.Fatal(err)
		}
		var items []crossItem
		for i, f := range frames {
			opened, err := rcv.Open(nil, f)
			c := sealErrorCode(t, err)
			if c != want[i] {
				t.Fatalf("Go SignalReceiver on frame %d: %s (%v), this test expects %s", i, c, err, want[i])
			}
			if err == nil && !bytes.Equal(opened, pts[i]) {
				t.Fatalf("Go SignalReceiver opened frame %d wrong", i)
			}
			seq, _ := link.Sequence(f)
			items = append(items, crossItem{Hex: hex.EncodeToString(f), Seq: seq, PlaintextHex: hex.EncodeToString(pts[i]), Expect: c})
		}
		return items
	}
	sender := func(now func() time.Time) *link.SignalSender {
		t.Helper()
		s, err := link.NewSignalSender(key, now)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	s := sender(nil)
	p := [][]byte{[]byte("offer"), []byte("candidate 1"), []byte("candidate 2"), {}, randomBytes(t, 65536-link.Overhead)}
	f0, f1, f2 := s.Seal(nil, p[0]), s.Seal(nil, p[1]), s.Seal(nil, p[2])
	forged := append([]byte(nil), f2...)
	forged[len(forged)-1] ^= 1
	f3, f4 := s.Seal(nil, p[3]), s.Seal(nil, p[4])
	a := stream(
		[][]byte{f0, f1, f1, f0, forged, f2, f3, f4},
		[][]byte{p[0], p[1], p[1], p[0], p[2], p[2], p[3], p[4]},
		[]string{"ok", "ok", "replay", "replay", "bad_tag", "ok", "ok", "ok"},
	)

	past := sender(func() time.Time { return time.Now().Add(-6 * time.Minute) })
	future := sender(func() time.Time { return time.Now().Add(6 * time.Minute) })
	honest := sender(nil)
	q := [][]byte{[]byte("past"), []byte("future"), []byte("now")}
	b := stream(
		[][]byte{past.Seal(nil, q[0]), future.Seal(nil, q[1]), honest.Seal(nil, q[2])},
		q,
		[]string{"stale", "stale", "ok"},
	)
	return [][]crossItem{a, b}
}

// checkJSEnvelopes opens the c2p envelopes JS sealed with a Go Reader, in
// order (all are new), checks each is byte-identical to Go's sealing of
// the same sequence and plaintext (AES-GCM with a sequence nonce is
// deterministic), and that every single-byte change of the first fails.
func checkJSEnvelopes(t *testing.T, l link.Link, envs []crossPlain) {
	t.Helper()
	if len(envs) < 5 {
		t.Fatalf("JS sealed %d envelopes, want at least 5", len(envs))
	}
	r, err := link.NewReader(l.EnvelopeKey(link.C2P), 0)
	if err != nil {
		t.Fatal(err)
	}
	s := sealer(t, l.EnvelopeKey(link.C2P))
	sizes := map[int]bool{}
	for i, e := range envs {
		env, pt := unhexT(t, e.Hex), unhexT(t, e.PlaintextHex)
		seq, opened, err := r.Accept(nil, env)
		if err != nil {
			t.Fatalf("JS envelope %d (seq %d): Go Reader: %v", i, e.Seq, err)
		}
		if seq != e.Seq || !bytes.Equal(opened, pt) {
			t.Fatalf("JS envelope %d: Go opened seq %d, %d bytes; JS says seq %d, %d bytes", i, seq, len(opened), e.Seq, len(pt))
		}
		again, err := s.Seal(nil, seq, pt)
		if err != nil || !bytes.Equal(again, env) {
			t.Fatalf("JS envelope %d (seq %d) differs from Go's sealing of it (%v)", i, seq, err)
		}
		sizes[len(pt)] = true
	}
	if !sizes[0] || !sizes[65536-link.Overhead] {
		t.Errorf("JS envelopes lack an empty or a 65,511-byte plaintext: sizes %v", sizes)
	}
	if _, _, err := r.Accept(nil, unhexT(t, envs[0].Hex)); !errors.Is(err, link.ErrReplay) {
		t.Errorf("JS envelope 0 again: %v, want ErrReplay", err)
	}
	first := unhexT(t, envs[0].Hex)
	for i := range first {
		bad := append([]byte(nil), first...)
		bad[i] ^= 0x01
		if _, _, err := s.Open(nil, bad); !errors.Is(err, link.ErrBadTag) && !errors.Is(err, link.ErrMalformed) {
			t.Errorf("JS envelope 0 with byte %d changed: Open = %v, want ErrBadTag or ErrMalformed", i, err)
		}
	}
}

// checkJSSignals opens the c2p frames JS sealed (with Date.now) with a Go
// SignalReceiver on the real clock: every one opens, in order, and is what
// Go seals for its counter; a changed tag fails.
func checkJSSignals(t *testing.T, l link.Link, frames []crossPlain) {
	t.Helper()
	if len(frames) < 3 {
		t.Fatalf("JS sealed %d signal frames, want at least 3", len(frames))
	}
	rcv, err := link.NewSignalReceiver(l.SignalKey(link.C2P), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := sealer(t, l.SignalKey(link.C2P))
	now := uint64(time.Now().UnixMilli())
	for i, f := range frames {
		frame, pt := unhexT(t, f.Hex), unhexT(t, f.PlaintextHex)
		bad := append([]byte(nil), frame...)
		bad[len(bad)-1] ^= 0x80
		if _, err := rcv.Open(nil, bad); !errors.Is(err, link.ErrBadTag) {
			t.Fatalf("JS frame %d with its tag changed: %v, want ErrBadTag", i, err)
		}
		opened, err := rcv.Open(nil, frame)
		if err != nil {
			t.Fatalf("JS frame %d: Go SignalReceiver: %v", i, err)
		}
		if !bytes.Equal(opened, pt) {
			t.Fatalf("JS frame %d: Go opened %q, JS sealed %q", i, opened, pt)
		}
		counter, _ := link.Sequence(frame)
		if counter != f.Seq || counter+60_000 < now || counter > now+60_000 {
			t.Fatalf("JS frame %d: counter %d (JS says %d), Go's clock %d", i, counter, f.Seq, now)
		}
		again, _ := s.Seal(nil, counter, pt)
		if !bytes.Equal(again, frame) {
			t.Fatalf("JS frame %d differs from Go's sealing of counter %d", i, counter)
		}
	}
	if _, err := rcv.Open(nil, unhexT(t, frames[0].Hex)); !errors.Is(err, link.ErrReplay) {
		t.Errorf("JS frame 0 again: %v, want ErrReplay", err)
	}
}

// checkJSGenerated: a link JS generated parses in Go (a 22-character id, a
// 32-byte key), derives the token JS derived and opens JS's envelope.
func checkJSGenerated(t *testing.T, out crossOut) {
	t.Helper()
	g := out.Generated
	id, key, ok := strings.Cut(g.Code, ".")
	if !ok || len(id) != 22 {
		t.Fatalf("JS generated code %q: want <22-character id>.<key>", g.Code)
	}
	if idRaw, err := base64.RawURLEncoding.Strict().DecodeString(id); err != nil || len(idRaw) != 16 {
		t.Fatalf("JS generated id %q is not base64url of 16 bytes (%v)", id, err)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(key)
	if err != nil || len(raw) != link.KeySize {
		t.Fatalf("JS generated key %q: %d bytes, %v", key, len(raw), err)
	}
	gl := link.Link{Key: [link.KeySize]byte(raw), ID: id}
	if gl.AccessToken() != g.AccessToken {
		t.Errorf("JS generated link: token %q, Go derives %q", g.AccessToken, gl.AccessToken())
	}
	seq, pt, err := sealer(t, gl.EnvelopeKey(link.P2C)).Open(nil, unhexT(t, g.Envelope))
	if err != nil || seq != 1 || string(pt) != "generated" {
		t.Errorf("JS generated link's envelope: seq %d, %q, %v", seq, pt, err)
	}
}

func unhexT(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
