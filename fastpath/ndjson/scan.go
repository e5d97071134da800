package ndjson

import (
	"bytes"
	"errors"
)

// Limits of the spec (agent-relay.md, "Frames").
const (
	MaxTypeLen  = 128 // bytes of type, decoded
	MaxIDLen    = 256 // bytes of instance, session, id and re, decoded
	MaxTraceLen = 128 // bytes of trace, decoded

	// MaxDepth is the deepest nesting of objects and arrays Scan accepts,
	// counting the frame object itself. encoding/json allows 10000; the
	// bound keeps a hostile line from costing a deep walk for nothing,
	// and no real payload comes near it.
	MaxDepth = 128
)

// Errors returned by Scan. Every one of them means the line is dropped (a
// client request gets relay.error malformed_frame); the link lives on.
var (
	ErrNotObject = errors.New("ndjson: line is not a JSON object")
	ErrSyntax    = errors.New("ndjson: line is not valid JSON")
	ErrTooDeep   = errors.New("ndjson: JSON nested deeper than 128 levels")

	// ErrField is matched (errors.Is) by every error below: the line is JSON
	// but its envelope breaks a rule of the spec, or would make the
	// endpoint's decoder fail.
	ErrField = errors.New("ndjson: invalid envelope field")

	ErrFieldType   error = &fieldError{"an envelope field has the wrong JSON type"} // "type":5, "seq":"1"
	ErrNoType      error = &fieldError{"type is missing or empty"}
	ErrFieldLength error = &fieldError{"an envelope field is too long"}
	ErrFieldChars  error = &fieldError{"an envelope field holds a control character, DEL or a lone surrogate"}
	ErrTrace       error = &fieldError{"trace holds a character other than A-Z a-z 0-9 - _"}
	ErrSeq         error = &fieldError{"seq is not an unsigned 64-bit integer"} // -1, 1.0, 1e3, 2^64
	ErrIDAndRe     error = &fieldError{"both id and re are set"}
	ErrNoInstance  error = &fieldError{"session without instance"}
)

// fieldError is an ErrField with the rule that was broken.
type fieldError struct{ msg string }

func (e *fieldError) Error() string        { return "ndjson: " + e.msg }
func (e *fieldError) Is(target error) bool { return target == ErrField }

// Frame is where the envelope of one line is: offsets into the line Scan was
// given, so it is only meaningful together with that line.
//
// Each field holds the value the endpoint's decoder would end up with: the
// last occurrence of the key, in any case, that was not null.
type Frame struct {
	Type, Instance, Session, ID, Re, Trace Field

	Seq uint64 // 0 when absent

	// Payload is the raw value of the payload member (any JSON value,
	// null included, exactly as written); empty when absent.
	Payload Span

	// What Splice needs to replace instance and session.
	open      int  // offset of the object's '{'
	firstKept bool // the first member is neither instance nor session
	nCuts     int  // top-level members keyed instance or session
	// cuts are the byte ranges that remove those members, while nCuts
	// is at most len(cuts); beyond that Splice walks the line again.
	cuts [4]Span
}

// IsControl reports whether the frame is for the relay: its type begins
// with "relay.".
func (f *Frame) IsControl(line []byte) bool { return f.Type.HasPrefix(line, "relay.") }

// Scan validates line as one frame and reports where its envelope fields
// are. line is one line without its line feed (see Reader), or one
// WebSocket message (see ScanMessage).
//
// The line must be exactly one JSON object (RFC 8259), with only whitespace
// around it. Every value is validated, including the payload and unknown
// members, whose nesting may not exceed MaxDepth. Strings must be valid
// UTF-8. Keys and duplicates are read the way encoding/json reads them into
// a struct (see the package documentation), and the envelope must satisfy
// the spec:
//
//   - type is present, at most MaxTypeLen bytes;
//   - instance, session, id and re are at most MaxIDLen bytes;
//   - those five hold no byte below 0x20, no 0x7f, and are valid UTF-8;
//   - id and re are not both set; session is not set without instance;
//   - trace is at most MaxTraceLen bytes of A-Z a-z 0-9 - _;
//   - seq is an integer from 0 to 2^64-1 (0 means absent);
//   - each of these is of its JSON type (a string, a number for seq) or null.
//
// Lengths are of the decoded value. An empty string is absent.
//
// The errors are ErrNotObject, ErrSyntax, ErrTooDeep, or one of the
// ErrField family; in all cases the caller drops the line, and the Frame is
// the zero Frame.
func Scan(line []byte) (Frame, error) {
	f, err := scan(line)
	if err != nil {
		return Frame{}, err
	}
	return f, nil
}

// scan is Scan, except that when only a check of the envelope fails it
// leaves in f what it found.
func scan(line []byte) (f Frame, err error) {
	b := line
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return f, ErrNotObject
	}
	f.open = i
	if i = skipWS(b, i+1); i >= len(b) {
		return f, ErrSyntax
	}
	if b[i] != '}' {
		valueEnd := 0 // where the previous member's value ended
		for member := 0; ; member++ {
			if b[i] != '"' {
				return f, ErrSyntax
			}
			keyStart := i
			if i, _, err = scanString(b, i); err != nil {
				return f, err
			}
			key := matchKey(b[keyStart+1 : i-1])
			if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
				return f, ErrSyntax
			}
			if i = skipWS(b, i+1); i >= len(b) {
				return f, ErrSyntax
			}
			if i, err = f.member(b, i, key); err != nil {
				return f, err
			}
			if key == keyInstance || key == keySession {
				// Splice removes this member and the separator before it,
				// or, for the first member, nothing before it.
				cut := Span{valueEnd, i}
				if member == 0 {
					cut.Start = keyStart
				}
				if f.nCuts < len(f.cuts) {
					f.cuts[f.nCuts] = cut
				}
				f.nCuts++
			} else if member == 0 {
				f.firstKept = true
			}
			valueEnd = i
			if i = skipWS(b, i); i >= len(b) {
				return f, ErrSyntax
			}
			if b[i] == '}' {
				break
			}
			if b[i] != ',' {
				return f, ErrSyntax
			}
			if i = skipWS(b, i+1); i >= len(b) {
				return f, ErrSyntax
			}
		}
	}
	if skipWS(b, i+1) != len(b) { // i is at the closing '}'
		return f, ErrSyntax
	}
	return f, f.check(b)
}

// ScanMessage is Scan for a WebSocket message from a client, which the spec
// wants dropped when it holds a raw carriage return or line feed even where
// JSON allows one as whitespace: the relay appends the line feed itself.
func ScanMessage(msg []byte) (Frame, error) {
	if bytes.IndexByte(msg, '\r') >= 0 {
		return Frame{}, ErrSyntax
	}
	return Scan(msg) // which refuses '\n'
}

// member reads the value of a top-level member whose name is key, starting
// at b[i], into f, and returns the offset just past it.
func (f *Frame) member(b []byte, i, key int) (int, error) {
	var dst *Field
	switch key {
	case keyType:
		dst = &f.Type
	case keyInstance:
		dst = &f.Instance
	case keySession:
		dst = &f.Session
	case keyID:
		dst = &f.ID
	case keyRe:
		dst = &f.Re
	case keyTrace:
		dst = &f.Trace
	case keySeq:
		switch c := b[i]; {
		case c == 'n': // null leaves seq as it was, like encoding/json
			return scanLiteral(b, i, "null")
		case c == '-' || isDigit(c):
			seq, end, err := scanUint(b, i)
			if err == nil {
				f.Seq = seq
			}
			return end, err
		default:
			return i, ErrFieldType
		}
	case keyPayload:
		end, err := skipValue(b, i, 2)
		if err == nil {
			f.Payload = Span{i, end}
		}
		return end, err
	default:
		return skipValue(b, i, 2)
	}
	switch b[i] {
	case '"':
		end, escaped, err := scanString(b, i)
		if err == nil {
			*dst = Field{Start: i + 1, End: end - 1, Escaped: escaped}
		}
		return end, err
	case 'n': // null leaves the field as it was, like encoding/json
		return scanLiteral(b, i, "null")
	default:
		return i, ErrFieldType
	}
}

// check applies the spec's rules to the envelope Scan found.
func (f *Frame) check(b []byte) error {
	if !f.Type.Present() {
		return ErrNoType
	}
	if err := checkText(b, f.Type, MaxTypeLen); err != nil {
		return err
	}
	for _, t := range [...]Field{f.Instance, f.Session, f.ID, f.Re} {
		if err := checkText(b, t, MaxIDLen); err != nil {
			return err
		}
	}
	if err := checkTrace(b, f.Trace); err != nil {
		return err
	}
	if f.ID.Present() && f.Re.Present() {
		return ErrIDAndRe
	}
	if f.Session.Present() && !f.Instance.Present() {
		return ErrNoInstance
	}
	return nil
}
