package mailbox_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"edgerelay/sdk/mailbox"
)

func frame(envs ...[]byte) []byte {
	var b []byte
	for _, e := range envs {
		b = binary.BigEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b
}

func TestDecodeBatch(t *testing.T) {
	e25 := bytes.Repeat([]byte{1}, 25)
	e40 := bytes.Repeat([]byte{2}, 40)
	ok := []struct {
		name string
		body []byte
		want [][]byte
	}{
		{"empty body: nothing above after", nil, nil},
		{"one smallest envelope", frame(e25), [][]byte{e25}},
		{"two", frame(e40, e25), [][]byte{e40, e25}},
	}
	for _, c := range ok {
		got, err := mailbox.DecodeBatch(c.body)
		if err != nil || len(got) != len(c.want) {
			t.Fatalf("%s: %d envelopes, %v; want %d", c.name, len(got), err, len(c.want))
		}
		for i := range got {
			if !bytes.Equal(got[i], c.want[i]) {
				t.Fatalf("%s: envelope %d = %x", c.name, i, got[i])
			}
			// Each envelope is capped at its own end: appending to one
			// cannot overwrite the next.
			if cap(got[i]) != len(got[i]) {
				t.Fatalf("%s: envelope %d has spare capacity %d", c.name, i, cap(got[i])-len(got[i]))
			}
		}
	}

	two := frame(e40, e25)
	bad := []struct {
		name string
		body []byte
	}{
		{"zero-length prefix", frame([]byte{})},
		{"zero-length after a good one", frame(e25, []byte{})},
		{"length 24, under the minimum", frame(e25[:24])},
		{"1 byte of prefix", []byte{0}},
		{"3 bytes of prefix", []byte{0, 0, 0}},
		{"prefix cut after a good envelope", append(frame(e25), 0, 0)},
		{"body cut by one byte", two[:len(two)-1]},
		{"prefix alone", two[:4]},
		{"prefix says more than the body holds", binary.BigEndian.AppendUint32(nil, 0xffffffff)},
		{"trailing byte", append(frame(e25), 7)},
	}
	for _, c := range bad {
		got, err := mailbox.DecodeBatch(c.body)
		if !errors.Is(err, mailbox.ErrBatch) || got != nil {
			t.Errorf("%s: %d envelopes, %v; want ErrBatch", c.name, len(got), err)
		}
	}
}
