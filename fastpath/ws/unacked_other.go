//go:build !linux

package ws

import "net"

// unacked cannot be asked here: the drain then relies on the peer's
// silence alone (see linger).
func unacked(*net.TCPConn) (int, bool) { return 0, false }
