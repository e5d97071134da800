package turnbench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/pion/stun/v3"

	"edgerelay/turn"
	"edgerelay/turn/turntest"
)

// streamChannel is the channel every stream client binds: each allocation
// is alone on its connection.
const streamChannel = 0x4000

// streamClient is an allocation over TCP or TLS (RFC 8656 §12.5, a UDP
// relay reached over a stream): the control plane by raw STUN requests
// (turntest.STUNClient: long-term credentials from the 401 challenge),
// then ChannelData frames, padded to 4 bytes, written and read on the
// connection as the UDP load sends datagrams.
type streamClient struct {
	conn net.Conn
	// suite is the TLS cipher suite negotiated (TLS only).
	suite   uint16
	started bool
	done    chan struct{}
}

func dialStreamClient(ctx context.Context, o LoadOptions, label string, peer netip.AddrPort) (*streamClient, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	var (
		conn net.Conn
		err  error
	)
	c := &streamClient{done: make(chan struct{})}
	if o.Transport == TLS {
		tc, terr := (&tls.Dialer{NetDialer: &d, Config: o.TLS}).DialContext(ctx, "tcp", o.Server.String())
		if terr == nil {
			c.suite = tc.(*tls.Conn).ConnectionState().CipherSuite
		}
		conn, err = tc, terr
	} else {
		conn, err = d.DialContext(ctx, "tcp", o.Server.String())
	}
	if err != nil {
		return nil, fmt.Errorf("turnbench: dial %s %s: %w", o.Transport, o.Server, err)
	}
	c.conn = conn
	user, pass := turn.Credentials(o.Secret, label, time.Hour, time.Now())
	sc := turntest.NewSTUNClient(conn, true, user, pass)
	if res, err := sc.Request(stun.MethodAllocate, true, turntest.TransportUDP); err != nil || turntest.ErrorCodeOf(res) != 0 {
		_ = conn.Close()
		return nil, fmt.Errorf("turnbench: Allocate: %v (code %d)", err, codeOf(res))
	}
	// ChannelBind installs the permission too. Nothing more comes from the
	// server until data flows, so the STUN client's read buffer is empty
	// and the connection can be read afresh.
	res, err := sc.Request(stun.MethodChannelBind, true, turntest.ChannelNumber(streamChannel), turntest.PeerAddress(peer))
	if err != nil || turntest.ErrorCodeOf(res) != 0 {
		_ = conn.Close()
		return nil, fmt.Errorf("turnbench: ChannelBind: %v (code %d)", err, codeOf(res))
	}
	return c, nil
}

func codeOf(m *stun.Message) int {
	if m == nil {
		return 0
	}
	return turntest.ErrorCodeOf(m)
}

func (c *streamClient) channel() uint16        { return streamChannel }
func (c *streamClient) stride(payload int) int { return (4 + payload + 3) &^ 3 }

// start reads frames until the connection closes: ChannelData to onEcho,
// anything else (a STUN message) passed over. Nothing is allocated per
// frame.
func (c *streamClient) start(onEcho func([]byte)) {
	c.started = true
	go func() {
		defer close(c.done)
		r := bufio.NewReaderSize(c.conn, 128<<10) // room for the biggest frame
		for {
			head, err := r.Peek(4)
			if err != nil {
				return
			}
			size, ok := turntest.StreamFrameSize(head)
			if !ok {
				return // neither STUN nor ChannelData: the stream is lost
			}
			frame, err := r.Peek(size)
			if err != nil {
				return
			}
			if frame[0]&0xC0 == 0x40 { // head may have moved with the Peek
				onEcho(frame[4 : 4+int(binary.BigEndian.Uint16(frame[2:4]))])
			}
			if _, err := r.Discard(size); err != nil {
				return
			}
		}
	}()
}

// send writes the frames in one write: one TCP segment (or TLS record) for
// a window slot refilled alone.
func (c *streamClient) send(buf []byte, _, _ int) error {
	if _, err := c.conn.Write(buf); err != nil {
		return fmt.Errorf("turnbench: stream write: %w", err)
	}
	return nil
}

func (c *streamClient) close() {
	_ = c.conn.Close()
	if c.started {
		<-c.done
	}
}

// tlsSuite is the negotiated TLS cipher suite's name, "" over plain TCP.
func (c *streamClient) tlsSuite() string {
	if c.suite == 0 {
		return ""
	}
	return tls.CipherSuiteName(c.suite)
}
