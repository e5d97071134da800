package turnbench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"edgerelay/turn"
	"edgerelay/turn/turntest"
)

// udpClient is an allocation made by pion's client over UDP, its data
// path driven raw (turntest.ChannelConn): one datagram per send, or GSO
// runs.
type udpClient struct {
	alloc  *turntest.Allocation
	server netip.AddrPort
	ch     uint16
	gso    *gsoSender // nil: one datagram per send
}

func dialUDPClient(ctx context.Context, o LoadOptions, label string, peer netip.AddrPort) (*udpClient, error) {
	user, pass := turn.Credentials(o.Secret, label, time.Hour, time.Now())
	a, err := turntest.Allocate(o.Server, user, pass)
	if err != nil {
		return nil, err
	}
	c := &udpClient{alloc: a, server: o.Server}
	if c.ch, err = a.BindChannel(ctx, net.UDPAddrFromAddrPort(peer)); err != nil {
		a.Close()
		return nil, err
	}
	if o.GSO > 1 {
		if c.gso, err = newGSOSender(a.Conn.UDPConn, o.Server); err != nil {
			a.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *udpClient) channel() uint16        { return c.ch }
func (c *udpClient) stride(payload int) int { return 4 + payload }
func (c *udpClient) start(onEcho func([]byte)) {
	c.alloc.Conn.OnData(onEcho)
}

func (c *udpClient) send(buf []byte, n, stride int) error {
	if c.gso != nil && n > 1 {
		return c.gso.send(buf, stride)
	}
	for i := range n {
		if _, err := c.alloc.Conn.UDPConn.WriteToUDPAddrPort(buf[i*stride:(i+1)*stride], c.server); err != nil {
			return fmt.Errorf("turnbench: client send: %w", err)
		}
	}
	return nil
}

func (c *udpClient) close() { c.alloc.Close() }
