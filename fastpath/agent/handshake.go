package agent

import (
	"encoding/json"
	"errors"
	"net"
	"strconv"

	"edgerelay/fastpath/ndjson"
)

// ProtocolVersion is the highest envelope version this relay speaks.
const ProtocolVersion = 1

// helloPayload is the payload of relay.hello. The handshake happens once
// per link, so it is decoded with encoding/json, which matches keys as
// librelay's decoder does (case-insensitively, the last duplicate winning).
// The version and the nonce are kept raw so that their JSON types are
// checked here: encoding/json would take "1" (a string) for a version and
// leave "" and null alike as an empty nonce.
type helloPayload struct {
	ProtocolVersion json.RawMessage `json:"protocol_version"`
	Instance        string          `json:"instance"`
	Agent           string          `json:"agent"`
	Nonce           json.RawMessage `json:"nonce"`
}

// handshake reads the hello and returns the welcome to send, or answers
// relay.error (re: the hello's id) and returns false. Errors are answers,
// not requests, so nothing here breaks "no control request before the
// welcome".
//
// The codes matter to the connector: unknown_instance and
// malformed_frame make it retry later; unsupported_version is fatal to it.
// (unauthorized would be too, and is never sent here: a bad token was
// refused with 401 or 403 before the upgrade.)
func (h *Handler) handshake(l *link) ([]byte, bool) {
	line, err := l.r.Next()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !l.closed.Load() {
			h.m.handshakes.WithLabelValues("timeout").Inc()
		} else {
			h.m.handshakes.WithLabelValues("malformed").Inc()
		}
		return nil, false
	}
	f, err := ndjson.Scan(line)
	if err != nil {
		h.refuseHello(l, line, nil, "malformed", codeMalformedFrame, "the first frame is not a valid relay.hello")
		return nil, false
	}
	if !f.Type.Equal(line, typeHello) {
		h.refuseHello(l, line, &f, "malformed", codeMalformedFrame, "the first frame must be relay.hello")
		return nil, false
	}
	var p helloPayload
	if f.Payload.Len() == 0 {
		h.refuseHello(l, line, &f, "malformed", codeMalformedFrame, "relay.hello without a payload")
		return nil, false
	}
	if err := json.Unmarshal(f.Payload.Bytes(line), &p); err != nil {
		h.refuseHello(l, line, &f, "malformed", codeMalformedFrame, "relay.hello payload is malformed")
		return nil, false
	}

	// The hello must name the instance the bearer token belongs to in the
	// payload, where librelay's Hello carries it (an empty or null one
	// names none), and the envelope may not name another.
	want := l.in.name
	if p.Instance != want || (f.Instance.Present() && !f.Instance.Equal(line, want)) {
		h.refuseHello(l, line, &f, "unknown_instance", codeUnknownInstance, "the token belongs to another instance")
		return nil, false
	}

	// protocol_version = min(hello's, ours); the hello's must be a JSON
	// integer of at least 1.
	version, ok := helloVersion(p.ProtocolVersion)
	if !ok {
		h.refuseHello(l, line, &f, "unsupported_version", codeUnsupportedVersion, "protocol_version must be an integer of at least 1")
		return nil, false
	}

	// No nonce (absent or null): no sig. A nonce is a string of padded
	// base64 holding 1 to 64 bytes: an empty one is refused like any nonce
	// of 0 bytes, and the upper bound limits what an unauthenticated peer
	// can make the relay sign.
	var sig []byte
	if len(p.Nonce) > 0 && string(p.Nonce) != "null" {
		var nonce []byte
		if p.Nonce[0] != '"' || json.Unmarshal(p.Nonce, &nonce) != nil {
			h.refuseHello(l, line, &f, "malformed", codeMalformedFrame, "nonce is not a base64 string")
			return nil, false
		}
		var err error
		if sig, err = SignWelcome(h.cfg.Key, nonce, version, want); err != nil {
			h.refuseHello(l, line, &f, "malformed", codeMalformedFrame, "nonce must hold 1 to 64 bytes")
			return nil, false
		}
	}
	return appendWelcome(nil, l.in.id, f.ID.Raw(line), version, h.cfg.RelayName, sig), true
}

// helloVersion is the version selected for a hello's raw protocol_version:
// min(it, ProtocolVersion), when it is a JSON integer of at least 1.
func helloVersion(raw json.RawMessage) (int, bool) {
	if len(raw) == 0 || raw[0] < '0' || raw[0] > '9' {
		return 0, false // absent, null, negative, or not a number at all
	}
	offered, err := strconv.ParseUint(string(raw), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return ProtocolVersion, true // a huge integer is still more than ours
	case err != nil || offered < 1:
		return 0, false // 1.0, 1e0, 0
	case offered < ProtocolVersion:
		return int(offered), true
	}
	return ProtocolVersion, true
}

// refuseHello answers a hello that cannot be welcomed with relay.error and
// counts the outcome; the link is then closed (after the answer is
// flushed). f is nil when the line did not even scan.
func (h *Handler) refuseHello(l *link, line []byte, f *ndjson.Frame, outcome, code, message string) {
	h.m.handshakes.WithLabelValues(outcome).Inc()
	h.log.Info("instance hello refused", "instance", l.in.name, "code", code)
	var inst, re []byte
	if f != nil {
		inst, re = f.Instance.Raw(line), f.ID.Raw(line)
	} else if id := requestID(line); usableID(id) {
		// A hello that does not scan (nested too deep, say) still gets
		// its answer with re: the connector matches it to its hello.
		re = ndjson.AppendString(nil, id)
		re = re[1 : len(re)-1]
	}
	l.send(appendError(nil, inst, nil, re, code, []byte(message)))
}
