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
//   - 508 for an Allocate while the server drains.
//
// reply sends a response to the client on the transport the message came
// in on. screen reports whether it answered, in which case pion must not
// see the message. raw must not be written to; it is only read.
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
	if err := m.Decode(); err != nil || !m.Contains(stun.AttrMessageIntegrity) {
		return false // pion answers: 400, or the 401 challenge with a nonce
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
	switch typ.Method {
	case stun.MethodAllocate:
		if s.draining.Load() {
			reply(s.errorResponse(m, stun.CodeInsufficientCapacity, key))
			return true
		}
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
