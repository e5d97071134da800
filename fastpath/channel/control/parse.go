package control

import (
	"errors"
	"slices"

	"edgerelay/fastpath/jsonlex"
)

// Errors returned by Parse. Every one of them means a malformed control frame,
// which closes the control socket (1008); they differ only for the log.
var (
	ErrNotJSON       = errors.New("control: not valid JSON") // matched by every *SyntaxError
	ErrTooDeep       = errors.New("control: JSON nested too deeply")
	ErrNotObject     = errors.New("control: not a JSON object")
	ErrMissingType   = errors.New("control: missing type")
	ErrUnknownType   = errors.New("control: unknown type")
	ErrMissingID     = errors.New("control: missing id")
	ErrBadID         = errors.New("control: id is not 32 lowercase hex characters")
	ErrMissingData   = errors.New("control: data message without data")
	ErrDataNotString = errors.New("control: data is not a string")
	ErrDataTooLong   = errors.New("control: data longer than 70000 bytes")
)

// Type is the kind of a message a computer sends.
type Type uint8

// The message types a computer may send. "open" is only ever sent by the
// relay (AppendOpen), so Parse refuses it like any other unknown type.
const (
	TypeData  Type = iota + 1 // carry Data to the phone as one text frame
	TypeClose                 // close the phone channel with 1000
)

func (t Type) String() string {
	switch t {
	case TypeData:
		return "data"
	case TypeClose:
		return "close"
	}
	return "invalid"
}

// Message is one control message from a computer.
type Message struct {
	Type Type
	ID   ID
	// Data is the unescaped data of a TypeData message (nil for TypeClose).
	// It aliases either the frame (when the string had no escapes, which is
	// the usual case) or the scratch buffer, so it stays valid only while
	// neither is reused: until the next Parse with that scratch, and until
	// the frame's buffer is recycled.
	Data []byte
}

// Parse validates one control frame from a computer and decodes it.
//
// The whole frame must be one valid JSON value (RFC 8259) with only
// whitespace around it, even the parts Parse has no use for: values of
// unknown keys are validated and skipped, nested at most MaxDepth deep. The
// value must be an object; its keys may come in any order and may be written
// with escapes, unknown keys are ignored, and of duplicate keys the last one
// wins, as in the reference relay's JSON.parse. "type" must be "data" or
// "close" and "id" 32 lowercase hex characters. A data message needs a string
// "data" of at most MaxData bytes once unescaped; a close message ignores
// "data". Strings must be valid UTF-8 (see jsonlex.ScanString for the fine print and
// appendUnescaped for lone surrogates).
//
// Data that contains escapes is unescaped into scratch, which Parse grows when
// it is too small; it returns the possibly bigger buffer, which the caller
// should keep for the next call. A scratch of capacity MaxData never grows, so
// in steady state Parse allocates nothing. It returns the scratch even when it
// fails.
//
// Errors are *SyntaxError (errors.Is ErrNotJSON), or one of ErrTooDeep,
// ErrNotObject, ErrMissingType, ErrUnknownType, ErrMissingID, ErrBadID,
// ErrMissingData, ErrDataNotString, ErrDataTooLong. A syntax error anywhere
// wins over a problem with the message's content.
func Parse(frame []byte, scratch []byte) (msg Message, newScratch []byte, err error) {
	i := skipWS(frame, 0)
	if i >= len(frame) {
		return Message{}, scratch, errEnd(frame)
	}
	if frame[i] != '{' {
		// Tell "valid JSON but not an object" from "not JSON" for the log.
		end, err := skipValue(frame, i, 1)
		if err == nil {
			err = checkEnd(frame, end, ErrNotObject)
		}
		return Message{}, scratch, err
	}

	// What the keys said so far; later duplicates overwrite earlier ones.
	var (
		typeSeen bool
		typ      Type // 0: not a string, or not "data" or "close"
		idSeen   bool
		idOK     bool
		data     dataState
	)

	i = skipWS(frame, i+1)
	if i < len(frame) && frame[i] == '}' {
		i++
	} else {
		for {
			if i >= len(frame) {
				return Message{}, scratch, errEnd(frame)
			}
			if frame[i] != '"' {
				return Message{}, scratch, syntaxError(i, "expected a string key")
			}
			keyEnd, keyEscaped, e := jsonlex.ScanString(frame, i)
			if e.Failed() {
				return Message{}, scratch, lexError(frame, e)
			}
			k := classifyKey(frame[i+1:keyEnd-1], keyEscaped)
			if i = skipWS(frame, keyEnd); i >= len(frame) || frame[i] != ':' {
				return Message{}, scratch, syntaxError(i, "expected ':' after a key")
			}
			i = skipWS(frame, i+1)

			start := i
			if k != keyOther && i < len(frame) && frame[i] == '"' {
				// A string value for a key we use.
				end, escaped, e := jsonlex.ScanString(frame, i)
				if e.Failed() {
					return Message{}, scratch, lexError(frame, e)
				}
				raw := frame[start+1 : end-1]
				switch k {
				case keyType:
					typeSeen, typ = true, decodeType(raw, escaped)
				case keyID:
					idSeen = true
					idOK = decodeID(&msg.ID, raw, escaped)
				case keyData:
					data, msg.Data, scratch = decodeData(raw, escaped, scratch)
				}
				i = end
			} else {
				// Anything else only needs to be valid.
				if i, err = skipValue(frame, i, 2); err != nil {
					return Message{}, scratch, err
				}
				switch k {
				case keyType:
					typeSeen, typ = true, 0
				case keyID:
					idSeen, idOK = true, false
				case keyData:
					data, msg.Data = dataNotString, nil
				}
			}

			if i = skipWS(frame, i); i >= len(frame) {
				return Message{}, scratch, errEnd(frame)
			}
			if frame[i] == '}' {
				i++
				break
			}
			if frame[i] != ',' {
				return Message{}, scratch, syntaxError(i, "expected ',' or '}' in an object")
			}
			i = skipWS(frame, i+1)
		}
	}
	if err := checkEnd(frame, i, nil); err != nil {
		return Message{}, scratch, err
	}

	switch {
	case !typeSeen:
		return Message{}, scratch, ErrMissingType
	case typ == 0:
		return Message{}, scratch, ErrUnknownType
	case !idSeen:
		return Message{}, scratch, ErrMissingID
	case !idOK:
		return Message{}, scratch, ErrBadID
	}
	msg.Type = typ
	if typ == TypeClose {
		msg.Data = nil
		return msg, scratch, nil
	}
	switch data {
	case dataMissing:
		return Message{}, scratch, ErrMissingData
	case dataNotString:
		return Message{}, scratch, ErrDataNotString
	case dataTooLong:
		return Message{}, scratch, ErrDataTooLong
	}
	return msg, scratch, nil
}

// checkEnd returns ok if only whitespace follows offset i, and a syntax error
// about trailing garbage otherwise.
func checkEnd(frame []byte, i int, ok error) error {
	if i = skipWS(frame, i); i < len(frame) {
		return syntaxError(i, "data after the JSON value")
	}
	return ok
}

// key is a key of the message object that Parse cares about.
type key uint8

const (
	keyOther key = iota
	keyType
	keyID
	keyData
)

// classifyKey names the key whose string body is raw.
func classifyKey(raw []byte, escaped bool) key {
	if escaped {
		var buf [len("data")]byte
		v, ok := appendUnescaped(buf[:0], raw, len(buf))
		if !ok {
			return keyOther // longer than any key we know
		}
		raw = v
	}
	switch string(raw) {
	case "type":
		return keyType
	case "id":
		return keyID
	case "data":
		return keyData
	}
	return keyOther
}

// decodeType returns the Type named by the string body raw, or 0.
func decodeType(raw []byte, escaped bool) Type {
	if escaped {
		var buf [len("close")]byte
		v, ok := appendUnescaped(buf[:0], raw, len(buf))
		if !ok {
			return 0
		}
		raw = v
	}
	switch string(raw) {
	case "data":
		return TypeData
	case "close":
		return TypeClose
	}
	return 0
}

// decodeID stores the id whose string body is raw in id and reports whether
// it is 32 lowercase hex characters.
func decodeID(id *ID, raw []byte, escaped bool) bool {
	if escaped {
		var buf [IDLen]byte
		v, ok := appendUnescaped(buf[:0], raw, len(buf))
		if !ok {
			return false
		}
		raw = v
	}
	if len(raw) != IDLen {
		return false
	}
	for _, c := range raw {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	copy(id[:], raw)
	return true
}

// dataState is what the last "data" key held.
type dataState uint8

const (
	dataMissing dataState = iota
	dataOK
	dataNotString
	dataTooLong
)

// decodeData returns the value of a "data" string whose body is raw: the
// body itself when it has no escapes, otherwise its unescaped form in
// scratch (grown if needed, and returned). A value over MaxData bytes is
// dataTooLong; it is not an error yet, because a later "data" key would
// replace it.
func decodeData(raw []byte, escaped bool, scratch []byte) (dataState, []byte, []byte) {
	if !escaped {
		if len(raw) > MaxData {
			return dataTooLong, nil, scratch
		}
		return dataOK, raw, scratch
	}
	// The value is never longer than raw, and appendUnescaped stops at
	// MaxData, so this is all the room it can need.
	scratch = slices.Grow(scratch[:0], min(len(raw), MaxData))
	v, ok := appendUnescaped(scratch, raw, MaxData)
	if !ok {
		return dataTooLong, nil, scratch
	}
	return dataOK, v, scratch
}
