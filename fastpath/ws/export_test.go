package ws

import "edgerelay/fastpath/tlsrec"

// Taken reports whether c's writer has taken everything queued (for the
// external tests that need a write in flight before they queue more).
func Taken(c *Conn) bool { return c.taken() }

// TLSTakenOver reports whether c's TLS records are tlsrec's now.
func TLSTakenOver(c *Conn) bool {
	rc, ok := c.nc.(*tlsrec.Conn)
	return ok && rc.TakenOver()
}

// TLSWriteKeysHeld reports whether c's record layer holds its write AEAD.
func TLSWriteKeysHeld(c *Conn) bool {
	rc, ok := c.nc.(*tlsrec.Conn)
	return ok && rc.WriteKeysHeld()
}
