//go:build !linux

package netlimit

import (
	"net"
	"sync"
	"syscall"
)

// Elsewhere reads and writes go through net.Conn (sysio_linux.go says
// why Linux does otherwise).

func rawConnOf(net.Conn) syscall.RawConn { return nil }

func newSysOps() *sync.Pool { return nil }

func (c *conn) sysRead(b []byte) (int, error) { return c.Conn.Read(b) }

// TryWrite takes nothing here: the caller leaves it all to its writer.
func (c *conn) TryWrite([]byte) (int, error) { return 0, nil }

// TryRead finds nothing here: the caller leaves the reading to its reader.
func (c *conn) TryRead([]byte, bool) (int, error) { return 0, nil }
