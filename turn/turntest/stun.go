package turntest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/pion/stun/v3"
)

// STUNClient speaks raw STUN and TURN to a server over UDP, TCP or any
// stream, one request at a time, so tests can send what a library client
// would not (no allocation, LIFETIME 0, any channel number, any size) and
// see the exact answer.
type STUNClient struct {
	conn        net.Conn
	stream      bool
	r           *bufio.Reader
	user, pass  string
	realm       string
	nonce       string
	readTimeout time.Duration
}

// DialSTUN connects to addr over network ("udp" or "tcp") with REST
// credentials user and pass.
func DialSTUN(network, addr, user, pass string) (*STUNClient, error) {
	c, err := net.Dial(network, addr)
	if err != nil {
		return nil, fmt.Errorf("turntest: dial %s %s: %w", network, addr, err)
	}
	return NewSTUNClient(c, network != "udp", user, pass), nil
}

// NewSTUNClient wraps a connected socket; stream is true for TCP and TLS.
func NewSTUNClient(c net.Conn, stream bool, user, pass string) *STUNClient {
	return &STUNClient{conn: c, stream: stream, r: bufio.NewReaderSize(c, 128<<10), user: user, pass: pass, readTimeout: 2 * time.Second}
}

// As is a client on the same connection under other credentials (its own
// nonce), to send requests as another user from the same 5-tuple. Do not
// read from both at once.
func (c *STUNClient) As(user, pass string) *STUNClient {
	return &STUNClient{conn: c.conn, stream: c.stream, r: c.r, user: user, pass: pass, readTimeout: c.readTimeout}
}

// Conn is the client's socket, for a test's own data path.
func (c *STUNClient) Conn() net.Conn { return c.conn }

// Close closes the connection.
func (c *STUNClient) Close() error { return c.conn.Close() }

// LocalAddr is the client's transport address.
func (c *STUNClient) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// Request sends a request of method with attrs and returns the response.
// With authed it signs the request with the long-term credential, first
// learning realm and nonce from the 401 challenge to an unsigned Allocate
// (and again on a 438 stale nonce).
func (c *STUNClient) Request(method stun.Method, authed bool, attrs ...stun.Setter) (*stun.Message, error) {
	if authed && c.nonce == "" {
		if err := c.challenge(); err != nil {
			return nil, err
		}
	}
	for try := 0; ; try++ {
		setters := append([]stun.Setter{stun.TransactionID, stun.NewType(method, stun.ClassRequest)}, attrs...)
		if authed && c.nonce != "" {
			setters = append(setters, stun.NewUsername(c.user), stun.NewRealm(c.realm), stun.NewNonce(c.nonce),
				stun.NewLongTermIntegrity(c.user, c.realm, c.pass))
		}
		setters = append(setters, stun.Fingerprint)
		req, err := stun.Build(setters...)
		if err != nil {
			return nil, fmt.Errorf("turntest: building %v: %w", method, err)
		}
		res, err := c.roundTrip(req)
		if err != nil {
			return nil, err
		}
		if authed && try < 2 && ErrorCodeOf(res) == 438 && c.learn(res) {
			continue
		}
		return res, nil
	}
}

// challenge learns realm and nonce from the 401 to an unsigned Allocate.
func (c *STUNClient) challenge() error {
	req := stun.MustBuild(stun.TransactionID, stun.NewType(stun.MethodAllocate, stun.ClassRequest), TransportUDP, stun.Fingerprint)
	res, err := c.roundTrip(req)
	if err != nil {
		return err
	}
	if code := ErrorCodeOf(res); code != 401 || !c.learn(res) {
		return fmt.Errorf("turntest: an unsigned Allocate got %d, want a 401 challenge", code)
	}
	return nil
}

func (c *STUNClient) learn(res *stun.Message) bool {
	var realm stun.Realm
	var nonce stun.Nonce
	if realm.GetFrom(res) != nil || nonce.GetFrom(res) != nil {
		return false
	}
	c.realm, c.nonce = realm.String(), nonce.String()
	return true
}

func (c *STUNClient) roundTrip(req *stun.Message) (*stun.Message, error) {
	if err := c.Send(req.Raw); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(c.readTimeout)
	for {
		frame, err := c.ReadFrame(deadline)
		if err != nil {
			return nil, fmt.Errorf("turntest: waiting for the answer to %v: %w", req.Type, err)
		}
		if len(frame) < 20 || frame[0]&0xC0 != 0 {
			continue // ChannelData
		}
		res := &stun.Message{Raw: append([]byte(nil), frame...)}
		if err := res.Decode(); err != nil {
			return nil, fmt.Errorf("turntest: decoding an answer: %w", err)
		}
		if res.TransactionID == req.TransactionID {
			return res, nil
		}
	}
}

// Send writes one raw frame.
func (c *STUNClient) Send(frame []byte) error {
	if _, err := c.conn.Write(frame); err != nil {
		return fmt.Errorf("turntest: write: %w", err)
	}
	return nil
}

// ReadFrame reads the next whole frame from the server (a STUN message or
// ChannelData, with a stream's padding) before deadline.
func (c *STUNClient) ReadFrame(deadline time.Time) ([]byte, error) {
	if err := c.conn.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	if !c.stream {
		buf := make([]byte, 64<<10)
		n, err := c.conn.Read(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	head, err := c.r.Peek(4)
	if err != nil {
		return nil, err
	}
	size, ok := StreamFrameSize(head)
	if !ok {
		return nil, errors.New("turntest: stream carries neither STUN nor ChannelData")
	}
	frame := make([]byte, size)
	if _, err := io.ReadFull(c.r, frame); err != nil {
		return nil, err
	}
	return frame, nil
}

// StreamFrameSize is the size of the frame a TURN stream (TCP or TLS)
// carries next, from its first 4 bytes: a STUN message (20-byte header
// plus its length) or ChannelData (4-byte header plus its length, padded
// to 4, RFC 8656 §12.5); ok is false for neither.
func StreamFrameSize(head []byte) (size int, ok bool) {
	length := int(binary.BigEndian.Uint16(head[2:4]))
	switch head[0] & 0xC0 {
	case 0x00:
		return 20 + length, true
	case 0x40:
		return (4 + length + 3) &^ 3, true
	}
	return 0, false
}

// ChannelData frames payload for channel ch, padded on a stream.
func (c *STUNClient) ChannelData(ch uint16, payload []byte) []byte {
	size := 4 + len(payload)
	if c.stream {
		size = (size + 3) &^ 3
	}
	frame := make([]byte, size)
	binary.BigEndian.PutUint16(frame[0:2], ch)
	binary.BigEndian.PutUint16(frame[2:4], uint16(len(payload)))
	copy(frame[4:], payload)
	return frame
}

// SendIndication builds a Send indication of data to peer.
func SendIndication(peer netip.AddrPort, data []byte) []byte {
	return stun.MustBuild(stun.TransactionID, stun.NewType(stun.MethodSend, stun.ClassIndication),
		PeerAddress(peer), stun.RawAttribute{Type: stun.AttrData, Value: data}).Raw
}

// PeerAddress is an XOR-PEER-ADDRESS attribute.
func PeerAddress(peer netip.AddrPort) stun.Setter {
	return peerAddress(peer)
}

type peerAddress netip.AddrPort

func (p peerAddress) AddTo(m *stun.Message) error {
	ap := netip.AddrPort(p)
	return (&stun.XORMappedAddress{IP: ap.Addr().AsSlice(), Port: int(ap.Port())}).AddToAs(m, stun.AttrXORPeerAddress)
}

// Lifetime is a LIFETIME attribute of seconds.
func Lifetime(seconds uint32) stun.Setter {
	return stun.RawAttribute{Type: stun.AttrLifetime, Value: binary.BigEndian.AppendUint32(nil, seconds)}
}

// ChannelNumber is a CHANNEL-NUMBER attribute.
func ChannelNumber(n uint16) stun.Setter {
	return stun.RawAttribute{Type: stun.AttrChannelNumber, Value: []byte{byte(n >> 8), byte(n), 0, 0}}
}

// TransportUDP is REQUESTED-TRANSPORT for UDP, which an Allocate needs.
var TransportUDP stun.Setter = stun.RawAttribute{Type: stun.AttrRequestedTransport, Value: []byte{17, 0, 0, 0}}

// ErrorCodeOf is the ERROR-CODE of a response, 0 for a success.
func ErrorCodeOf(m *stun.Message) int {
	var code stun.ErrorCodeAttribute
	if code.GetFrom(m) != nil {
		return 0
	}
	return int(code.Code)
}

// LifetimeOf is a response's LIFETIME in seconds, -1 without one.
func LifetimeOf(m *stun.Message) int {
	v, err := m.Get(stun.AttrLifetime)
	if err != nil || len(v) != 4 {
		return -1
	}
	return int(binary.BigEndian.Uint32(v))
}

// RelayedAddressOf is a response's XOR-RELAYED-ADDRESS.
func RelayedAddressOf(m *stun.Message) (netip.AddrPort, error) {
	var a stun.XORMappedAddress
	if err := a.GetFromAs(m, stun.AttrXORRelayedAddress); err != nil {
		return netip.AddrPort{}, fmt.Errorf("turntest: XOR-RELAYED-ADDRESS: %w", err)
	}
	ip, _ := netip.AddrFromSlice(a.IP)
	return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)), nil
}

// DataIndicationOf decodes a Data indication: the peer and the data.
func DataIndicationOf(frame []byte) (netip.AddrPort, []byte, error) {
	m := &stun.Message{Raw: append([]byte(nil), frame...)}
	if err := m.Decode(); err != nil {
		return netip.AddrPort{}, nil, err
	}
	if m.Type != stun.NewType(stun.MethodData, stun.ClassIndication) {
		return netip.AddrPort{}, nil, fmt.Errorf("turntest: %v, not a Data indication", m.Type)
	}
	var a stun.XORMappedAddress
	if err := a.GetFromAs(m, stun.AttrXORPeerAddress); err != nil {
		return netip.AddrPort{}, nil, err
	}
	data, err := m.Get(stun.AttrData)
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	ip, _ := netip.AddrFromSlice(a.IP)
	return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)), data, nil
}
