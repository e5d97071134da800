package turnbench

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
)

// echoPeer is a load's UDP peer: it sends every datagram back where it
// came from, one at a time (turntest.EchoPeer) or in GSO runs (runPeer).
type echoPeer interface {
	Addr() *net.UDPAddr
	Received() uint64
	Close() error
}

// runFlushAfter is how long a run peer holds a run that is not full before
// it sends what it has: long against a loopback burst (the datagrams of a
// run a server relays one by one arrive microseconds apart), short
// against the load's loss timeout, so that a window thinned by a loss
// still moves.
const runFlushAfter = time.Millisecond

// runPeer echoes in GSO runs: it reads one datagram at a time and sends
// them back, to the address they came from, as one sendmsg with
// UDP_SEGMENT once it holds run of them (or after runFlushAfter, or when
// one of another size or from another address comes). A peer that sends
// in bursts (a QUIC stack, a browser's SCTP over a kernel with GSO, another
// relay) does the same; the server's relay socket then gets its input as
// runs whatever the server sent the peer, so both servers of a comparison
// get the same load: ours reads a run coalesced (UDP_GRO on its relay
// sockets), coturn one datagram at a time.
type runPeer struct {
	conn     *net.UDPConn
	run      int
	received atomic.Uint64
	done     chan struct{}
}

func newRunPeer(addr netip.AddrPort, run int) (*runPeer, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("turnbench: run peer: %w", err)
	}
	p := &runPeer{conn: c, run: run, done: make(chan struct{})}
	go p.loop()
	return p, nil
}

func (p *runPeer) loop() {
	defer close(p.done)
	var (
		buf     = make([]byte, runPeerBuffer)
		held    int // datagrams in buf, each seg bytes
		seg     int
		to      netip.AddrPort
		send    *gsoSender
		senders = map[netip.AddrPort]*gsoSender{}
	)
	flush := func() {
		if held == 0 {
			return
		}
		if held == 1 {
			_, _ = p.conn.WriteToUDPAddrPort(buf[:seg], to)
		} else {
			_ = send.send(buf[:held*seg], seg)
		}
		held = 0
		_ = p.conn.SetReadDeadline(time.Time{})
	}
	for {
		n, from, err := p.conn.ReadFromUDPAddrPort(buf[held*seg : held*seg+maxDatagram])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			flush()
			continue
		}
		if err != nil {
			return
		}
		p.received.Add(1)
		if held > 0 && (n != seg || from != to) {
			// Not of the run: the run goes first, then this one starts the next.
			at := held * seg
			flush()
			copy(buf, buf[at:at+n])
		}
		if held == 0 {
			seg, to = n, from
			if send = senders[from]; send == nil {
				if send, err = newGSOSender(p.conn, from); err != nil {
					return
				}
				senders[from] = send
			}
			_ = p.conn.SetReadDeadline(time.Now().Add(runFlushAfter))
		}
		held++
		if held == p.run || (held+1)*seg+maxDatagram > len(buf) {
			flush()
		}
	}
}

const (
	// maxDatagram is the biggest UDP datagram over IPv4.
	maxDatagram = 65507
	// runPeerBuffer holds a run of 64 of the load's biggest datagrams
	// (1,400 bytes) with room behind it for the biggest read.
	runPeerBuffer = 64*1400 + maxDatagram
)

func (p *runPeer) Addr() *net.UDPAddr { return p.conn.LocalAddr().(*net.UDPAddr) }
func (p *runPeer) Received() uint64   { return p.received.Load() }

func (p *runPeer) Close() error {
	err := p.conn.Close()
	<-p.done
	return err
}
