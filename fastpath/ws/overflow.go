package ws

// CloseOverflow closes the socket the way an overflow of its own queue
// does: what is queued and not yet being written is dropped, and the close
// frame with Options.OverflowCode follows the write in progress. It is for
// a producer that bounds memory across several sockets (the agent relay's
// budget for all clients of one instance) and drops one of them as too
// slow although its own queue still had room. Safe from any goroutine, any
// number of times; the first close wins.
func (c *Conn) CloseOverflow() {
	c.close(c.opts.OverflowCode, "send queue full", true)
}
