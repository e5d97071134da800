package link_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"testing"

	"edgerelay/sdk/link"
)

func TestNew(t *testing.T) {
	a, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	b, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	if a.Key == b.Key || a.ID == b.ID {
		t.Fatal("two links share a key or an id")
	}
	if len(a.ID) != 22 {
		t.Errorf("ID %q has %d characters, want 22", a.ID, len(a.ID))
	}
	if id, err := base64.RawURLEncoding.DecodeString(a.ID); err != nil || len(id) != 16 {
		t.Errorf("ID %q: %d bytes, %v", a.ID, len(id), err)
	}
	if tok := a.AccessToken(); len(tok) != 43 || tok == b.AccessToken() {
		t.Errorf("AccessToken %q", tok)
	}
	// The four keys and the token are distinct outputs.
	seen := map[[32]byte]bool{}
	tok, _ := base64.RawURLEncoding.DecodeString(a.AccessToken())
	for _, k := range [][32]byte{[32]byte(tok), a.EnvelopeKey(link.P2C), a.EnvelopeKey(link.C2P), a.SignalKey(link.P2C), a.SignalKey(link.C2P)} {
		if seen[k] {
			t.Fatal("two derived keys are equal")
		}
		seen[k] = true
	}
}

func TestInvalidDirectionPanics(t *testing.T) {
	l, _ := link.New()
	for name, f := range map[string]func(){
		"EnvelopeKey": func() { l.EnvelopeKey("x2y") },
		"SignalKey":   func() { l.SignalKey("") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s of an invalid direction did not panic", name)
				}
			}()
			f()
		}()
	}
	if link.Direction("P2C").Valid() {
		t.Error(`Direction("P2C").Valid()`)
	}
}

func newSealer(t testing.TB) *link.Sealer {
	t.Helper()
	var key [32]byte
	key[0] = 7
	s, err := link.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func seal(t testing.TB, s *link.Sealer, seq uint64, msg string) []byte {
	t.Helper()
	env, err := s.Seal(nil, seq, []byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestSealOpenRoundTrip(t *testing.T) {
	s := newSealer(t)
	for _, msg := range []string{"", "x", string(bytes.Repeat([]byte("ab"), 5000))} {
		prefix := []byte("keep")
		env, err := s.Seal(prefix, 42, []byte(msg))
		if err != nil {
			t.Fatal(err)
		}
		if string(env[:4]) != "keep" || len(env) != 4+len(msg)+link.Overhead {
			t.Fatalf("Seal did not append: %d bytes", len(env))
		}
		seq, pt, err := s.Open([]byte("pre"), env[4:])
		if err != nil || seq != 42 || string(pt) != "pre"+msg {
			t.Fatalf("Open = %d, %d bytes, %v", seq, len(pt), err)
		}
	}
}

func TestSealRefusesSeqZero(t *testing.T) {
	s := newSealer(t)
	dst := []byte("x")
	out, err := s.Seal(dst, 0, []byte("hi"))
	if !errors.Is(err, link.ErrZeroSeq) {
		t.Fatalf("Seal(seq 0) error = %v, want ErrZeroSeq", err)
	}
	if string(out) != "x" {
		t.Fatalf("Seal(seq 0) changed dst: %q", out)
	}
}

func TestOpenRefuses(t *testing.T) {
	s := newSealer(t)
	good := seal(t, s, 5, "hello")
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }

	cases := []struct {
		name string
		env  []byte
		want error
	}{
		{"empty", nil, link.ErrMalformed},
		{"24 bytes", make([]byte, 24), link.ErrMalformed},
		{"truncated tag", good[:len(good)-1], link.ErrBadTag},
		{"version 0x02", mutate(func(b []byte) []byte { b[0] = 2; return b }), link.ErrMalformed},
		{"version 0x00", mutate(func(b []byte) []byte { b[0] = 0; return b }), link.ErrMalformed},
		// Changing the sequence changes both the AAD and the nonce.
		{"seq byte flipped", mutate(func(b []byte) []byte { b[8] ^= 1; return b }), link.ErrBadTag},
		{"seq high byte flipped", mutate(func(b []byte) []byte { b[1] ^= 0x80; return b }), link.ErrBadTag},
		{"seq 0", mutate(func(b []byte) []byte { clear(b[1:9]); return b }), link.ErrMalformed},
		{"ciphertext flipped", mutate(func(b []byte) []byte { b[9] ^= 1; return b }), link.ErrBadTag},
		{"tag flipped", mutate(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), link.ErrBadTag},
		{"byte appended", append(bytes.Clone(good), 0), link.ErrBadTag},
		{"other key", func() []byte {
			var k [32]byte
			o, _ := link.NewSealer(k)
			return seal(t, o, 5, "hello")
		}(), link.ErrBadTag},
	}
	for _, c := range cases {
		seq, pt, err := s.Open(nil, c.env)
		if !errors.Is(err, c.want) || seq != 0 || pt != nil {
			t.Errorf("%s: Open = %d, %q, %v; want %v", c.name, seq, pt, err, c.want)
		}
	}
	if _, _, err := s.Open(nil, good); err != nil {
		t.Fatalf("the untouched envelope: %v", err)
	}
}

// TestTamperedAADDetected shows that the header is authenticated as AAD, not
// only checked: a body sealed (with the raw AEAD, same key and nonce) under
// the header 0x02||seq does not open under 0x01||seq, and a genuine header
// moved onto another envelope's body does not open either.
func TestTamperedAADDetected(t *testing.T) {
	var key [32]byte
	key[0] = 7
	s := newSealer(t)

	block, _ := aes.NewCipher(key[:])
	aead, _ := cipher.NewGCM(block)
	nonce := make([]byte, 12)
	nonce[11] = 9
	aad := []byte{2, 0, 0, 0, 0, 0, 0, 0, 9}
	forged := aead.Seal(bytes.Clone(aad), nonce, []byte("hello"), aad)
	forged[0] = link.Version
	if _, _, err := s.Open(nil, forged); !errors.Is(err, link.ErrBadTag) {
		t.Fatalf("body sealed under version 2, presented as version 1: %v, want ErrBadTag", err)
	}
	// Control: the same construction with the right AAD opens.
	aad[0] = link.Version
	if _, pt, err := s.Open(nil, aead.Seal(bytes.Clone(aad), nonce, []byte("hello"), aad)); err != nil || string(pt) != "hello" {
		t.Fatalf("raw AES-GCM envelope: %q, %v", pt, err)
	}

	env9 := seal(t, s, 9, "hello")
	env10 := seal(t, s, 10, "hello")
	swapped := append(bytes.Clone(env10[:link.HeaderSize]), env9[link.HeaderSize:]...)
	if _, _, err := s.Open(nil, swapped); !errors.Is(err, link.ErrBadTag) {
		t.Fatalf("header of 10 on body of 9: %v, want ErrBadTag", err)
	}
}

func TestSequence(t *testing.T) {
	s := newSealer(t)
	if seq, ok := link.Sequence(seal(t, s, 1<<40, "")); !ok || seq != 1<<40 {
		t.Errorf("Sequence = %d, %v", seq, ok)
	}
	for _, bad := range [][]byte{nil, make([]byte, 25), append([]byte{1}, make([]byte, 24)...)} {
		if _, ok := link.Sequence(bad); ok {
			t.Errorf("Sequence(%x) ok", bad)
		}
	}
}

// TestSealOpenAllocs: with a pre-grown dst, sealing and opening allocate
// nothing (the AEAD is built once and the nonce lives in the Sealer).
func TestSealOpenAllocs(t *testing.T) {
	s := newSealer(t)
	msg := make([]byte, 1024)
	dst := make([]byte, 0, len(msg)+link.Overhead)
	env := seal(t, s, 1, string(msg))
	out := make([]byte, 0, len(msg))
	if n := testing.AllocsPerRun(200, func() {
		if _, err := s.Seal(dst[:0], 3, msg); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Seal: %v allocs/op, want 0", n)
	}
	if n := testing.AllocsPerRun(200, func() {
		if _, _, err := s.Open(out[:0], env); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Open: %v allocs/op, want 0", n)
	}
	bad := bytes.Clone(env)
	bad[len(bad)-1] ^= 1
	if n := testing.AllocsPerRun(200, func() {
		if _, _, err := s.Open(out[:0], bad); err == nil {
			t.Fatal("bad tag opened")
		}
		if _, _, err := s.Open(out[:0], bad[:10]); err == nil {
			t.Fatal("short envelope opened")
		}
	}); n != 0 {
		t.Errorf("refused Open: %v allocs/op, want 0", n)
	}

	r, _ := link.NewReader([32]byte{7}, 0)
	envs := make([][]byte, 300)
	for i := range envs {
		envs[i] = seal(t, s, uint64(i+1), "m")
	}
	i := 0
	if n := testing.AllocsPerRun(200, func() {
		if _, _, err := r.Accept(out[:0], envs[i]); err != nil {
			t.Fatal(err)
		}
		i++
	}); n != 0 {
		t.Errorf("Reader.Accept: %v allocs/op, want 0", n)
	}
}
