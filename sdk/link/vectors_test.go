package link_test

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"edgerelay/sdk/link"
)

// vectors is testdata/mailbox-vectors.json, a copy of
// spec/mailbox-vectors.json (computed by two independent implementations).
type vectors struct {
	LinkKeyHex        string            `json:"link_key_hex"`
	LinkID            string            `json:"link_id"`
	SaltHex           string            `json:"salt_hex"`
	Labels            map[string]string `json:"labels"`
	AccessToken       string            `json:"access_token"`
	AccessTokenRawHex string            `json:"access_token_raw_hex"`
	EnvelopeKeyP2CHex string            `json:"envelope_key_p2c_hex"`
	EnvelopeKeyC2PHex string            `json:"envelope_key_c2p_hex"`
	SignalKeyP2CHex   string            `json:"signal_key_p2c_hex"`
	SignalKeyC2PHex   string            `json:"signal_key_c2p_hex"`
	Envelopes         []struct {
		Direction    string `json:"direction"`
		Key          string `json:"key"`
		Seq          uint64 `json:"seq"`
		Plaintext    string `json:"plaintext"`
		PlaintextHex string `json:"plaintext_hex"`
		NonceHex     string `json:"nonce_hex"`
		AADHex       string `json:"aad_hex"`
		EnvelopeHex  string `json:"envelope_hex"`
		Length       int    `json:"length"`
	} `json:"envelopes"`
}

func loadVectors(t *testing.T) (vectors, link.Link) {
	t.Helper()
	raw, err := os.ReadFile("testdata/mailbox-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode vectors: %v", err)
	}
	key := unhex(t, v.LinkKeyHex)
	if len(key) != link.KeySize {
		t.Fatalf("link key is %d bytes", len(key))
	}
	return v, link.Link{Key: [link.KeySize]byte(key), ID: v.LinkID}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("hex %q: %v", s, err)
	}
	return b
}

func TestVectorsKeys(t *testing.T) {
	v, l := loadVectors(t)

	if got := hex.EncodeToString([]byte(l.ID)); got != v.SaltHex {
		t.Errorf("salt = %s, want %s", got, v.SaltHex)
	}
	id, err := base64.RawURLEncoding.DecodeString(l.ID)
	if err != nil || len(id) != 16 {
		t.Errorf("link id %q: %d bytes, %v; want 16 bytes of base64url", l.ID, len(id), err)
	}

	tok := l.AccessToken()
	if tok != v.AccessToken {
		t.Errorf("AccessToken = %s, want %s", tok, v.AccessToken)
	}
	if len(tok) != 43 {
		t.Errorf("AccessToken has %d characters, want 43", len(tok))
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(raw); got != v.AccessTokenRawHex {
		t.Errorf("AccessToken raw = %s, want %s", got, v.AccessTokenRawHex)
	}

	for _, c := range []struct {
		name string
		got  [link.KeySize]byte
		want string
	}{
		{"EnvelopeKey(P2C)", l.EnvelopeKey(link.P2C), v.EnvelopeKeyP2CHex},
		{"EnvelopeKey(C2P)", l.EnvelopeKey(link.C2P), v.EnvelopeKeyC2PHex},
		{"SignalKey(P2C)", l.SignalKey(link.P2C), v.SignalKeyP2CHex},
		{"SignalKey(C2P)", l.SignalKey(link.C2P), v.SignalKeyC2PHex},
	} {
		if got := hex.EncodeToString(c.got[:]); got != c.want {
			t.Errorf("%s = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestVectorsLabels derives each value straight from crypto/hkdf with the
// labels the vectors file names, so a typo in our labels and one in the file
// cannot both pass TestVectorsKeys.
func TestVectorsLabels(t *testing.T) {
	v, l := loadVectors(t)
	want := map[string]string{
		"access":    v.AccessTokenRawHex,
		"p2c":       v.EnvelopeKeyP2CHex,
		"c2p":       v.EnvelopeKeyC2PHex,
		"signalP2c": v.SignalKeyP2CHex,
		"signalC2p": v.SignalKeyC2PHex,
	}
	if len(v.Labels) != len(want) {
		t.Fatalf("vectors have %d labels, want %d", len(v.Labels), len(want))
	}
	for name, label := range v.Labels {
		k, err := hkdf.Key(sha256.New, l.Key[:], unhex(t, v.SaltHex), label, 32)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(k); got != want[name] {
			t.Errorf("label %s (%s) derives %s, want %s", name, label, got, want[name])
		}
	}
}

func TestVectorsEnvelopes(t *testing.T) {
	v, l := loadVectors(t)
	if len(v.Envelopes) != 2 {
		t.Fatalf("vectors hold %d envelopes, want 2", len(v.Envelopes))
	}
	for _, e := range v.Envelopes {
		t.Run(e.Direction, func(t *testing.T) {
			d := link.Direction(e.Direction)
			if !d.Valid() || e.Key != "envelope_key_"+e.Direction {
				t.Fatalf("direction %q, key %q", e.Direction, e.Key)
			}
			want := unhex(t, e.EnvelopeHex)
			pt := unhex(t, e.PlaintextHex)
			if string(pt) != e.Plaintext {
				t.Fatalf("plaintext_hex %s is not %q", e.PlaintextHex, e.Plaintext)
			}
			if len(want) != e.Length || e.Length != len(pt)+link.Overhead {
				t.Fatalf("envelope is %d bytes, length %d, plaintext %d", len(want), e.Length, len(pt))
			}
			if got := hex.EncodeToString(want[:link.HeaderSize]); got != e.AADHex {
				t.Errorf("envelope's first 9 bytes %s, want AAD %s", got, e.AADHex)
			}
			nonce := append(make([]byte, 4), want[1:link.HeaderSize]...)
			if got := hex.EncodeToString(nonce); got != e.NonceHex {
				t.Errorf("nonce from the envelope %s, want %s", got, e.NonceHex)
			}

			s, err := link.NewSealer(l.EnvelopeKey(d))
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Seal(nil, e.Seq, pt)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Seal = %x\nwant   %x", got, want)
			}

			seq, opened, err := s.Open(nil, want)
			if err != nil || seq != e.Seq || string(opened) != e.Plaintext {
				t.Errorf("Open = %d, %q, %v; want %d, %q", seq, opened, err, e.Seq, e.Plaintext)
			}
			if s, ok := link.Sequence(want); !ok || s != e.Seq {
				t.Errorf("Sequence = %d, %v", s, ok)
			}

			r, err := link.NewReader(l.EnvelopeKey(d), 0)
			if err != nil {
				t.Fatal(err)
			}
			if seq, opened, err := r.Accept(nil, want); err != nil || seq != e.Seq || string(opened) != e.Plaintext {
				t.Errorf("Accept = %d, %q, %v", seq, opened, err)
			}

			// The other direction's key must not open it.
			other := link.C2P
			if d == link.C2P {
				other = link.P2C
			}
			o, _ := link.NewSealer(l.EnvelopeKey(other))
			if _, _, err := o.Open(nil, want); err != link.ErrBadTag {
				t.Errorf("Open under the %s key: %v, want ErrBadTag", other, err)
			}
		})
	}
}
