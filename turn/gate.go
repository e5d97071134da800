package turn

import (
	"encoding/binary"
	"net/netip"

	"github.com/pion/stun/v3"
)

// Auth failure reasons, as in the auth failure metric's label.
const (
	authBadCredentials = "bad_credentials" // integrity check failed: wrong password or secret
	authExpired        = "expired"         // the REST username's expiry has passed
	authMalformed      = "malformed"       // not a "<expiry>:<label>" username
	authWrongRealm     = "wrong_realm"
)

// screen looks at one STUN message from a client before pion does and
// answers it itself when pion would answer wrongly or not at all:
//
//   - 401 for wrong credentials (pion says 400, which coturn clients take
//     as a malformed request rather than an authentication failure);
//   - 401 for an expired REST username on a new allocation, or on any
//     request from a client that holds no allocation under that username.
//     Requests on an existing allocation keep working after the expiry,
//     as in coturn, which checks the expiry once per session and then
//     keeps the session's key;
//   - 403 for CreatePermission or ChannelBind to a peer address the
//     policy refuses (pion sends an error without a code, or 401);
//   - 508 for an Allocate while the server drains;
//   - 437 for Refresh, CreatePermission or ChannelBind from a 5-tuple with
//     no allocation (RFC 8656 §5; pion answers nothing, or 200 to a
//     Refresh with LIFETIME 0), and 441 for one under another username
//     than the allocation's;
//   - 400 for ChannelBind to a number outside 0x4000-0x7FFF (pion binds
//     any number, 0x0000 included; see channelNumberValid).
//
// It also rewrites a LIFETIME pion would misread (see lifetime.go) and
// signs the message again, so pion grants what RFC 8656 says.
//
// reply sends a response to the client on the transport the message came
// in on. screen reports whether it answered, in which case pion must not
// see the message. raw is only written to by that rewrite, in place.
func (s *Server) screen(t tuple, raw []byte, reply func([]byte)) (answered bool) {
	if len(raw) < 20 {
		return false
	}
	// The type is in the first two bytes: decode only the four methods
	// that carry credentials, so indications and Binding requests cost
	// nothing here.
	var typ stun.MessageType
	typ.ReadValue(binary.BigEndian.Uint16(raw[0:2]))
	if typ.Class != stun.ClassRequest {
		return false
	}
	switch typ.Method {
	case stun.MethodAllocate, stun.MethodRefresh, stun.MethodCreatePermission, stun.MethodChannelBind:
	default:
		return false
	}
	// A full slice expression: MessageIntegrity.Check appends into spare
	// capacity, which for a stream is the next frame.
	m := &stun.Message{Raw: raw[:len(raw):len(raw)]}
	if err := m.Decode(); err != nil {
		return false // pion answers 400
	}
	if !m.Contains(stun.AttrMessageIntegrity) {
		if typ.Method != stun.MethodAllocate && s.relays.lookup(t) == nil {
			// Nothing to authenticate for: RFC 8656 §5 answers 437 before
			// a challenge would lead anywhere.
			reply(s.errorResponse(m, stun.CodeAllocMismatch, nil))
			return true
		}
		return false // pion answers: the 401 challenge with a nonce
	}
	var (
		username stun.Username
		realm    stun.Realm
		nonce    stun.Nonce
	)
	if username.GetFrom(m) != nil || realm.GetFrom(m) != nil || nonce.GetFrom(m) != nil {
		return false // pion answers 400
	}
	unauthorized := func(reason string) bool {
		s.metrics.authFailed(reason)
		reply(s.errorResponse(m, stun.CodeUnauthorized, nil,
			stun.NewRealm(s.cfg.Realm), stun.NewNonce(nonce.String())))
		return true
	}
	if realm.String() != s.cfg.Realm {
		return unauthorized(authWrongRealm)
	}
	user := username.String()
	expiry, ok := restExpiry(user)
	if !ok {
		return unauthorized(authMalformed)
	}
	key := longTermKey(s.cfg.Secret, user, s.cfg.Realm)
	if stun.MessageIntegrity(key).Check(m) != nil {
		return unauthorized(authBadCredentials)
	}
	if expiry < s.cfg.Now().Unix() {
		if typ.Method == stun.MethodAllocate || !s.holds(t, user) {
			return unauthorized(authExpired)
		}
	}
	if typ.Method != stun.MethodAllocate {
		r := s.relays.lookup(t)
		if r == nil {
			reply(s.errorResponse(m, stun.CodeAllocMismatch, key))
			return true
		}
		if u := r.username.Load(); u != nil && *u != user {
			reply(s.errorResponse(m, stun.CodeWrongCredentials, key))
			return true
		}
	}
	switch typ.Method {
	case stun.MethodAllocate:
		if s.draining.Load() {
			reply(s.errorResponse(m, stun.CodeInsufficientCapacity, key))
			return true
		}
	case stun.MethodChannelBind:
		if v, err := m.Get(stun.AttrChannelNumber); err != nil || len(v) != 4 || !channelNumberValid(binary.BigEndian.Uint16(v)) {
			reply(s.errorResponse(m, stun.CodeBadRequest, key))
			return true
		}
	}
	switch typ.Method {
	case stun.MethodAllocate, stun.MethodRefresh:
		fixLifetime(m, typ.Method, key)
	case stun.MethodCreatePermission, stun.MethodChannelBind:
		denied := false
		_ = m.ForEach(stun.AttrXORPeerAddress, func(m *stun.Message) error {
			var peer stun.XORMappedAddress
			if peer.GetFromAs(m, stun.AttrXORPeerAddress) != nil {
				return nil // pion answers 400
			}
			ip, ok := netip.AddrFromSlice(peer.IP)
			if !ok || !s.peers.allowed(ip) {
				denied = true
			}
			return nil
		})
		if denied {
			s.metrics.peerRefused()
			reply(s.errorResponse(m, stun.CodeForbidden, key))
			return true
		}
	}
	return false
}

// channelNumberValid reports whether n is a channel number a client may
// bind: RFC 5766's 0x4000-0x7FFF. RFC 8656 §12 narrows it to 0x4000-0x4FFF,
// but the clients in the field pick numbers at random in the old range:
// libwebrtc (Chrome, and every app built on it: turn_port.cc has
// kMaxChannelNumber = 0x7FFF) and coturn's own turnutils_uclient, whose
// binds fail three times in four if 0x5000-0x7FFF answer 400. Frames on
// those channels still parse unambiguously: the first two bits 01 set
// ChannelData apart from STUN (00), and a TURN listener carries no DTLS or
// RTP (RFC 7983's 128-191).
func channelNumberValid(n uint16) bool { return n >= 0x4000 && n <= 0x7FFF }

// holds reports whether t has a live allocation made with username.
func (s *Server) holds(t tuple, username string) bool {
	r := s.relays.lookup(t)
	if r == nil {
		return false
	}
	u := r.username.Load()
	return u != nil && *u == username
}

// errorResponse builds an error response to m. key, when the request was
// authenticated, adds MESSAGE-INTEGRITY so the client can trust the
// answer.
func (s *Server) errorResponse(m *stun.Message, code stun.ErrorCode, key []byte, extra ...stun.Setter) []byte {
	setters := []stun.Setter{
		&stun.Message{TransactionID: m.TransactionID},
		stun.NewType(m.Type.Method, stun.ClassErrorResponse),
		&stun.ErrorCodeAttribute{Code: code},
	}
	setters = append(setters, extra...)
	if key != nil {
		setters = append(setters, stun.MessageIntegrity(key))
	}
	setters = append(setters, stun.Fingerprint)
	res, err := stun.Build(setters...)
	if err != nil {
		return nil
	}
	return res.Raw
}
