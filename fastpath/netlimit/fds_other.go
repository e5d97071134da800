//go:build !linux

package netlimit

import (
	"net"
	"os"
	"syscall"
)

// openReserve holds no spare descriptor where shedPending cannot use one.
func openReserve() int { return -1 }

// closeFD is never called: openReserve holds nothing here.
func closeFD(int) {}

// dupListener: no shedding outside Linux, Accept backs off instead.
func dupListener(net.Listener) (*os.File, syscall.RawConn) { return nil, nil }

// shedPending cannot take connections off the queue here: the caller backs
// off instead.
func (l *Listener) shedPending() (net.Conn, error) { return nil, errNoReserve }
