package agent

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// The relay's own frames are valid JSON in the spec's field order.
func TestFramesAreValidJSON(t *testing.T) {
	msg := appendUnsupportedMessage(nil, []byte(`relay."odd"\type`))
	for _, f := range [][]byte{
		appendAck(nil, []byte("inst"), nil, []byte(`h\u00e9`)),
		appendError(nil, []byte("i"), []byte("s"), []byte("r"), codeUnsupportedType, msg),
		appendProbe(nil, []byte(`in"st`), 7),
		appendDetach(nil, []byte("inst"), []byte("att-1")),
		appendWelcome(nil, []byte("inst"), []byte("hello"), 1, "name \"quoted\"", make([]byte, 64)),
		appendWelcome(nil, []byte("inst"), nil, 1, "n", nil),
	} {
		var v map[string]any
		if err := json.Unmarshal(f, &v); err != nil || !strings.HasPrefix(string(f), `{"type":"`) {
			t.Errorf("%s: %v", f, err)
		}
	}
	if got := string(appendWelcome(nil, []byte("inst-a"), []byte("hello"), 1, "r", nil)); got !=
		`{"type":"relay.welcome","instance":"inst-a","re":"hello","payload":{"protocol_version":1,"relay":"r"}}` {
		t.Errorf("welcome without sig: %s", got)
	}
}

// An unsupported type is named in the message cut to 128 bytes, on a rune
// boundary, and marked with an ellipsis. (A valid frame's type is at most
// 128 bytes, so the cut only shows for types that are escaped longer.)
func TestUnsupportedMessageCut(t *testing.T) {
	exact := strings.Repeat("t", 128)
	if got := string(appendUnsupportedMessage(nil, []byte(exact))); got != "unsupported message type "+exact {
		t.Errorf("128 bytes: %q", got)
	}
	long := strings.Repeat("t", 127) + "é" + strings.Repeat("x", 40) // é straddles byte 128
	got := appendUnsupportedMessage(nil, []byte(long))
	want := "unsupported message type " + strings.Repeat("t", 127) + "…"
	if string(got) != want || !utf8.Valid(got) {
		t.Errorf("cut: %q", got)
	}
}

func TestParseProbe(t *testing.T) {
	for in, want := range map[string]uint64{
		"relay-probe-1": 1, "relay-probe-18446744073709551615": 0, "relay-probe-": 0,
		"relay-probe-1x": 0, "other-1": 0, "relay-probe-42": 42,
	} {
		if got := parseProbe([]byte(in)); got != want {
			t.Errorf("%q: %d, want %d", in, got, want)
		}
	}
}
