// Package turntest has the pieces the TURN server's tests and its
// benchmark share: a UDP echo peer, and a client socket that lets a pion
// TURN client do the control plane (Allocate, permissions, ChannelBind)
// and then drives the data path itself, raw ChannelData without pion's
// per-datagram copies, so that a load generator measures the server and
// not the client library.
package turntest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/stun/v3"
	pionturn "github.com/pion/turn/v4"
)

// EchoPeer is a UDP peer that sends every datagram back where it came from.
type EchoPeer struct {
	conn     *net.UDPConn
	received atomic.Uint64
	done     chan struct{}
}

// NewEchoPeer listens on addr ("127.0.0.1:0") and echoes until Close.
func NewEchoPeer(addr string) (*EchoPeer, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		return nil, fmt.Errorf("turntest: echo peer: %w", err)
	}
	p := &EchoPeer{conn: c, done: make(chan struct{})}
	go p.loop()
	return p, nil
}

func (p *EchoPeer) loop() {
	defer close(p.done)
	buf := make([]byte, 64<<10)
	for {
		n, from, err := p.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		p.received.Add(1)
		_, _ = p.conn.WriteToUDPAddrPort(buf[:n], from)
	}
}

// Addr is the peer's address.
func (p *EchoPeer) Addr() *net.UDPAddr { return p.conn.LocalAddr().(*net.UDPAddr) }

// Received counts the datagrams the peer got.
func (p *EchoPeer) Received() uint64 { return p.received.Load() }

// Close stops the peer.
func (p *EchoPeer) Close() error {
	err := p.conn.Close()
	<-p.done
	return err
}

// ChannelConn is a client's UDP socket, handed to a pion TURN client as
// its Conn. It notes the channel number pion's first ChannelData write
// uses; once OnData is set, ChannelData from the server goes to that
// function (in the pion client's read goroutine) and not to pion.
type ChannelConn struct {
	*net.UDPConn
	server  netip.AddrPort
	channel atomic.Uint32 // 0 until pion sends ChannelData
	onData  atomic.Pointer[func(payload []byte)]
}

// NewChannelConn opens a client socket on loopback for server.
func NewChannelConn(server netip.AddrPort) (*ChannelConn, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(server.Addr(), 0)))
	if err != nil {
		return nil, fmt.Errorf("turntest: client socket: %w", err)
	}
	return &ChannelConn{UDPConn: c, server: server}, nil
}

// ReadFrom implements net.PacketConn for the pion client.
func (c *ChannelConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, src, err := c.UDPConn.ReadFromUDPAddrPort(p)
		if err != nil {
			return 0, nil, err
		}
		if fn := c.onData.Load(); fn != nil && n >= 4 && p[0]&0xC0 == 0x40 {
			length := int(binary.BigEndian.Uint16(p[2:4]))
			if 4+length <= n {
				(*fn)(p[4 : 4+length])
			}
			continue
		}
		return n, net.UDPAddrFromAddrPort(src), nil
	}
}

// WriteTo implements net.PacketConn for the pion client.
func (c *ChannelConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	if len(p) >= 4 && p[0]&0xC0 == 0x40 {
		c.channel.CompareAndSwap(0, uint32(binary.BigEndian.Uint16(p[0:2])))
	}
	return c.UDPConn.WriteTo(p, addr)
}

// Channel is the channel number pion bound, once it has used it.
func (c *ChannelConn) Channel() (uint16, bool) {
	n := c.channel.Load()
	return uint16(n), n != 0
}

// OnData takes over ChannelData from the server.
func (c *ChannelConn) OnData(fn func(payload []byte)) { c.onData.Store(&fn) }

// Send writes frame[4:] as ChannelData on the bound channel; frame[:4] is
// room for the header, which Send fills in.
func (c *ChannelConn) Send(frame []byte) error {
	ch, ok := c.Channel()
	if !ok {
		return errors.New("turntest: no channel bound yet")
	}
	binary.BigEndian.PutUint16(frame[0:2], ch)
	binary.BigEndian.PutUint16(frame[2:4], uint16(len(frame)-4))
	_, err := c.UDPConn.WriteToUDPAddrPort(frame, c.server)
	return err
}

// Allocation is a pion client's allocation over a ChannelConn.
type Allocation struct {
	Client *pionturn.Client
	Conn   *ChannelConn
	Relay  net.PacketConn // pion's relayed connection
}

// Allocate starts a pion client on a new ChannelConn and allocates.
func Allocate(server netip.AddrPort, username, password string) (*Allocation, error) {
	cc, err := NewChannelConn(server)
	if err != nil {
		return nil, err
	}
	cl, err := pionturn.NewClient(&pionturn.ClientConfig{
		TURNServerAddr: server.String(),
		Username:       username,
		Password:       password,
		Conn:           cc,
		LoggerFactory:  quiet{},
	})
	if err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("turntest: pion client: %w", err)
	}
	if err := cl.Listen(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("turntest: pion client listen: %w", err)
	}
	relay, err := cl.Allocate()
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("turntest: allocate: %w", err)
	}
	return &Allocation{Client: cl, Conn: cc, Relay: relay}, nil
}

// BindChannel writes probes to peer through pion until pion has bound a
// channel to it (its writes switch from Send indications to ChannelData),
// draining the echoes, and returns the channel number.
func (a *Allocation) BindChannel(ctx context.Context, peer net.Addr) (uint16, error) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // drain echoes so pion's inbound queue never fills
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = a.Relay.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			_, _, _ = a.Relay.ReadFrom(buf)
		}
	}()
	defer func() { close(stop); wg.Wait(); _ = a.Relay.SetReadDeadline(time.Time{}) }()
	for {
		if ch, ok := a.Conn.Channel(); ok {
			return ch, nil
		}
		if _, err := a.Relay.WriteTo([]byte("probe"), peer); err != nil {
			return 0, fmt.Errorf("turntest: probe: %w", err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("turntest: waiting for a channel binding: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close ends the allocation and the client.
func (a *Allocation) Close() {
	_ = a.Relay.Close()
	a.Client.Close()
	_ = a.Conn.Close()
}

// ErrorCode is the STUN error code in an error from the pion client, 0 if
// none.
func ErrorCode(err error) int {
	var te *stun.TurnError
	if errors.As(err, &te) {
		return int(te.ErrorCodeAttr.Code)
	}
	var tv stun.TurnError
	if errors.As(err, &tv) {
		return int(tv.ErrorCodeAttr.Code)
	}
	return 0
}
