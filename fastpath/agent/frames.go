package agent

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	"edgerelay/fastpath/ndjson"
)

// The frames the relay writes itself. They are appended to a caller's
// buffer, in the spec's field order (type, instance, session, id, re,
// payload), without encoding/json: the answers to heartbeats and bad
// requests are on the routing path too and must not allocate.
//
// Fields come in two forms. A raw field is the bytes between the quotes of
// a string member of a line the relay read (ndjson.Field.Raw): already
// valid JSON string content, so echoing it as written gives the peer back
// exactly the value it sent. A value is plain bytes, escaped here.

// Frame types the relay speaks.
const (
	typeHello     = "relay.hello"
	typeWelcome   = "relay.welcome"
	typeHeartbeat = "relay.heartbeat"
	typeAck       = "relay.ack"
	typeError     = "relay.error"
	typeDetach    = "acp.detach"
)

// Error codes of relay.error.
const (
	codeUnsupportedType    = "unsupported_type"
	codeMalformedFrame     = "malformed_frame"
	codeUnknownInstance    = "unknown_instance"
	codeUnsupportedVersion = "unsupported_version"
)

// maxTypeInMessage is where an unsupported type is cut in the error message.
const maxTypeInMessage = 128

// appendRaw appends ,"name":"raw" when raw is not empty.
func appendRaw(dst []byte, name string, raw []byte) []byte {
	if len(raw) == 0 {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':', '"')
	dst = append(dst, raw...)
	return append(dst, '"')
}

// appendValue appends ,"name":<value as a JSON string> when value is not
// empty.
func appendValue(dst []byte, name string, value []byte) []byte {
	if len(value) == 0 {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return ndjson.AppendString(dst, value)
}

func appendType(dst []byte, typ string) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, typ...)
	return append(dst, '"')
}

// appendAck appends {"type":"relay.ack","instance":…,"session":…,"re":…},
// the answer to a relay.heartbeat request; the fields are raw.
func appendAck(dst, instance, session, re []byte) []byte {
	dst = appendType(dst, typeAck)
	dst = appendRaw(dst, "instance", instance)
	dst = appendRaw(dst, "session", session)
	dst = appendRaw(dst, "re", re)
	return append(dst, '}')
}

// appendError appends a relay.error answering the request whose raw id is
// re, with the raw instance and session it named; message is a value.
func appendError(dst, instance, session, re []byte, code string, message []byte) []byte {
	dst = appendType(dst, typeError)
	dst = appendRaw(dst, "instance", instance)
	dst = appendRaw(dst, "session", session)
	dst = appendRaw(dst, "re", re)
	dst = append(dst, `,"payload":{"code":"`...)
	dst = append(dst, code...)
	dst = append(dst, `","message":`...)
	dst = ndjson.AppendString(dst, message)
	return append(dst, '}', '}')
}

// appendUnsupportedMessage appends the message of an unsupported_type
// answer: it names the type, cut to 128 bytes (on a rune boundary) and
// marked with an ellipsis when longer.
func appendUnsupportedMessage(dst, typ []byte) []byte {
	dst = append(dst, "unsupported message type "...)
	if len(typ) <= maxTypeInMessage {
		return append(dst, typ...)
	}
	cut := maxTypeInMessage
	for cut > 0 && !utf8.RuneStart(typ[cut]) {
		cut--
	}
	dst = append(dst, typ[:cut]...)
	return append(dst, "…"...)
}

// appendProbe appends the relay's heartbeat request to an instance:
// {"type":"relay.heartbeat","instance":…,"id":"relay-probe-<n>"}.
func appendProbe(dst, instance []byte, n uint64) []byte {
	dst = appendType(dst, typeHeartbeat)
	dst = appendValue(dst, "instance", instance)
	dst = append(dst, `,"id":"`...)
	dst = append(dst, probePrefix...)
	dst = strconv.AppendUint(dst, n, 10)
	return append(dst, '"', '}')
}

// probePrefix starts the id of every relay probe; the number after it
// tells the ack of the current probe from a stale one.
const probePrefix = "relay-probe-"

// parseProbe returns n for a raw re of "relay-probe-<n>", or 0.
func parseProbe(re []byte) uint64 {
	if len(re) <= len(probePrefix) || string(re[:len(probePrefix)]) != probePrefix {
		return 0
	}
	var n uint64
	for _, c := range re[len(probePrefix):] {
		if c < '0' || c > '9' || n > (1<<63)/10 {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

// appendDetach appends {"type":"acp.detach","instance":…,"session":…}, sent
// to the instance when a client goes away.
func appendDetach(dst, instance, session []byte) []byte {
	dst = appendType(dst, typeDetach)
	dst = appendValue(dst, "instance", instance)
	dst = appendValue(dst, "session", session)
	return append(dst, '}')
}

// appendWelcome appends the relay.welcome answering a hello whose raw id
// is re. sig is omitted when nil (a hello without a nonce).
func appendWelcome(dst, instance, re []byte, version int, relayName string, sig []byte) []byte {
	dst = appendType(dst, typeWelcome)
	dst = appendValue(dst, "instance", instance)
	dst = appendRaw(dst, "re", re)
	dst = append(dst, `,"payload":{"protocol_version":`...)
	dst = strconv.AppendInt(dst, int64(version), 10)
	dst = append(dst, `,"relay":`...)
	dst = ndjson.AppendString(dst, []byte(relayName))
	if sig != nil {
		dst = append(dst, `,"sig":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, sig)
		dst = append(dst, '"')
	}
	return append(dst, '}', '}')
}
