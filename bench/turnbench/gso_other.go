//go:build !linux

package turnbench

import (
	"errors"
	"net"
	"net/netip"
)

var errNoGSO = errors.New("turnbench: UDP GSO (UDP_SEGMENT) is Linux only; GRO-coalesced input cannot be made here")

type gsoSender struct{}

func newGSOSender(*net.UDPConn, netip.AddrPort) (*gsoSender, error) { return nil, errNoGSO }

func (*gsoSender) send([]byte, int) error { return errNoGSO }
