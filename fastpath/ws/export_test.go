package ws

// Taken reports whether c's writer has taken everything queued (for the
// external tests that need a write in flight before they queue more).
func Taken(c *Conn) bool { return c.taken() }
