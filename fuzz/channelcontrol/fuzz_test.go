// Package channelcontrol fuzzes the private-channel control-message codec,
// edgerelay/fastpath/channel/control, against encoding/json.
package channelcontrol

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"edgerelay/fastpath/channel/control"
)

const seedID = "0123456789abcdef0123456789abcdef"

// oracle decides a frame the slow way, with encoding/json, by the rules
// control.Parse documents. Beyond json.Valid it demands valid UTF-8 and
// nesting within control.MaxDepth, Parse's two deliberate extra limits.
func oracle(frame []byte) (msg control.Message, ok bool) {
	if !utf8.Valid(frame) || !json.Valid(frame) || nestingDepth(frame) > control.MaxDepth {
		return msg, false
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(frame))
	d.UseNumber() // 1e999 is valid JSON but no float64
	if err := d.Decode(&v); err != nil {
		panic(fmt.Sprintf("json.Valid(%q) but Decode: %v", frame, err))
	}
	m, isObject := v.(map[string]any) // of duplicate keys the last one wins
	if !isObject {
		return msg, false
	}
	switch m["type"] {
	case "data":
		msg.Type = control.TypeData
	case "close":
		msg.Type = control.TypeClose
	default:
		return msg, false
	}
	id, isString := m["id"].(string)
	if !isString || len(id) != control.IDLen || strings.Trim(id, "0123456789abcdef") != "" {
		return msg, false
	}
	copy(msg.ID[:], id)
	if msg.Type == control.TypeClose {
		return msg, true
	}
	data, isString := m["data"].(string)
	if !isString || len(data) > control.MaxData {
		return msg, false
	}
	msg.Data = []byte(data)
	return msg, true
}

// nestingDepth is the deepest nesting of objects and arrays in a valid JSON text.
func nestingDepth(frame []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(frame); i++ {
		switch c := frame[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

func sameMessage(a, b control.Message) bool {
	return a.Type == b.Type && a.ID == b.ID && bytes.Equal(a.Data, b.Data) && (a.Data == nil) == (b.Data == nil)
}

// FuzzParse checks that Parse never panics, accepts exactly what the
// encoding/json oracle accepts (so in particular only valid JSON) with the
// same content, and that what it accepts survives a trip through the encoder.
func FuzzParse(f *testing.F) {
	const id = `"` + seedID + `"`
	for _, s := range []string{
		`{"type":"data","id":` + id + `,"data":"hello"}`,
		`{"type":"close","id":` + id + `}`,
		`{"type":"open","id":` + id + `}`,
		` { "data" : "a\"b\\c\/\n\u00e9\ud83d\ude00\ud800" , "id" : ` + id + ` , "type" : "data" } `,
		`{"typ\u0065":"data","\u0069d":` + id + `,"data":"x","data":"y"}`,
		`{"type":"data","id":` + id + `,"x":{"a":[1,-0.5,2e10,true,false,null,{}],"b":[[]]},"data":"z"}`,
		`{"type":"close","id":` + id + `,"data":[1,{"2":"3"}],"n":-12.5E+3}`,
		`{"type":"data","id":"0123456789ABCDEF0123456789abcdef","data":"q"}`,
		`{"type":"data","id":` + id + `,"data":"é漢😀` + "\u2028" + `"}`,
		`{"type":"close","id":` + id + `,"x":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`,
		`["type","data"]`,
		"{\"type\":\"data\",\"id\":" + id + ",\"data\":\"\xff\"}",
		`{"type":"close","id":` + id + `} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		msg, _, err := control.Parse(frame, nil)
		want, ok := oracle(frame)
		if ok != (err == nil) {
			t.Fatalf("Parse(%q): err %v, but the oracle accepts: %v", frame, err, ok)
		}
		if err != nil {
			if msg.Type != 0 || msg.Data != nil {
				t.Fatalf("Parse(%q) failed with %v but returned %+v", frame, err, msg)
			}
			var se *control.SyntaxError
			if errors.Is(err, control.ErrNotJSON) != errors.As(err, &se) {
				t.Fatalf("Parse(%q): %v is not a proper syntax error", frame, err)
			}
			return
		}
		if !json.Valid(frame) {
			t.Fatalf("Parse accepted invalid JSON %q", frame)
		}
		if !sameMessage(msg, want) {
			t.Fatalf("Parse(%q) = %v %s %q, oracle %v %s %q", frame, msg.Type, msg.ID, msg.Data, want.Type, want.ID, want.Data)
		}

		// Encode it again and parse that, with a scratch buffer this time.
		msg.Data = bytes.Clone(msg.Data)
		var again []byte
		switch msg.Type {
		case control.TypeData:
			again = control.AppendData(nil, &msg.ID, msg.Data)
		case control.TypeClose:
			again = control.AppendClose(nil, &msg.ID)
		default:
			t.Fatalf("Parse(%q) returned type %d", frame, msg.Type)
		}
		got, _, err := control.Parse(again, make([]byte, 0, 8))
		if err != nil || !sameMessage(got, msg) {
			t.Fatalf("re-encoded %q parses to %+v, %v; want %+v", again, got, err, msg)
		}
	})
}

// FuzzAppendData checks that every phone frame (valid UTF-8, at most
// MaxData bytes) comes back intact from Parse and from json.Unmarshal, and
// that anything else still yields valid JSON syntax without a panic.
func FuzzAppendData(f *testing.F) {
	f.Add(uint64(0), uint64(0), []byte("hello"))
	f.Add(uint64(1), uint64(2), []byte(`"quoted" \back\ /slash/`))
	f.Add(uint64(3), uint64(4), []byte("\x00\x01\x1f\x7f\b\f\n\r\t"))
	f.Add(uint64(5), uint64(6), []byte("é€😀漢字\u2028\u2029\ufffd"))
	f.Add(uint64(7), uint64(8), []byte("\xff\xed\xa0\x80 invalid UTF-8"))
	f.Fuzz(func(t *testing.T, idHi, idLo uint64, data []byte) {
		var id control.ID
		var raw [16]byte
		binary.BigEndian.PutUint64(raw[:8], idHi)
		binary.BigEndian.PutUint64(raw[8:], idLo)
		hex.Encode(id[:], raw[:])

		prefix := []byte("pooled:")
		frame := control.AppendData(prefix, &id, data)
		if !bytes.HasPrefix(frame, prefix) {
			t.Fatalf("AppendData clobbered the buffer's contents")
		}
		frame = frame[len(prefix):]
		if !json.Valid(frame) {
			t.Fatalf("AppendData(%q) = %q, not valid JSON", data, frame)
		}
		msg, _, err := control.Parse(frame, nil)
		switch {
		case !utf8.Valid(data):
			// Passed through as-is; Parse insists on UTF-8.
			if !errors.Is(err, control.ErrNotJSON) {
				t.Fatalf("Parse(AppendData(%q)): err %v, want ErrNotJSON", data, err)
			}
			return
		case len(data) > control.MaxData:
			if !errors.Is(err, control.ErrDataTooLong) {
				t.Fatalf("Parse(AppendData(%d bytes)): err %v, want ErrDataTooLong", len(data), err)
			}
		case err != nil:
			t.Fatalf("Parse(AppendData(%q)): %v", data, err)
		case msg.Type != control.TypeData || msg.ID != id || !bytes.Equal(msg.Data, data):
			t.Fatalf("Parse(AppendData(%q)) = %v %s %q", data, msg.Type, msg.ID, msg.Data)
		}
		var v struct {
			Type, ID, Data string
		}
		if err := json.Unmarshal(frame, &v); err != nil {
			t.Fatalf("json.Unmarshal(%q): %v", frame, err)
		}
		if v.Type != "data" || v.ID != string(id[:]) || v.Data != string(data) {
			t.Fatalf("json.Unmarshal(%q) = %+v, want data %q", frame, v, data)
		}
	})
}
