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
// per link, so it is decoded with encoding/json, which reads it exactly as
// librelay wrote it (the nonce is a []byte: padded standard base64).
type helloPayload struct {
	ProtocolVersion json.Number `json:"protocol_version"`
	Instance        string      `json:"instance"`
	Agent           string      `json:"agent"`
	Nonce           []byte      `json:"nonce"`
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

	// The hello must name the instance the bearer token belongs to, in
	// the payload (which the connector signs over) and in the envelope.
	want := l.in.name
	claimed := p.Instance
	if claimed == "" {
		claimed = string(f.Instance.AppendValue(nil, line))
	}
	if claimed != want || (f.Instance.Present() && !f.Instance.Equal(line, want)) {
		h.refuseHello(l, line, &f, "unknown_instance", codeUnknownInstance, "the token belongs to another instance")
		return nil, false
	}

	// protocol_version = min(hello's, ours); the hello's must be at least 1.
	offered, err := strconv.ParseUint(p.ProtocolVersion.String(), 10, 64)
	if (err != nil && !errors.Is(err, strconv.ErrRange)) || offered < 1 {
		h.refuseHello(l, line, &f, "unsupported_version", codeUnsupportedVersion, "protocol_version must be an integer of at least 1")
		return nil, false
	}
	version := ProtocolVersion
	if err == nil && offered < ProtocolVersion {
		version = int(offered)
	}

	// No nonce: no sig. A nonce beyond 64 bytes is refused: it bounds
	// what an unauthenticated peer can make the relay sign.
	var sig []byte
	if len(p.Nonce) > 0 {
		sig, err = SignWelcome(h.cfg.Key, p.Nonce, version, want)
		if err != nil {
			h.refuseHello(l, line, &f, "malformed", codeMalformedFrame, "nonce longer than 64 bytes")
			return nil, false
		}
	}
	return appendWelcome(nil, l.in.id, f.ID.Raw(line), version, h.cfg.RelayName, sig), true
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
	}
	l.send(appendError(nil, inst, nil, re, code, []byte(message)))
}
