package turn

// streamUps is a TCP connection's ChannelData payloads to peers, queued
// while it handles what one read brought and sent on before the next
// read, each relay socket's as GSO runs or one sendmmsg (gso_linux.go),
// instead of one send per frame: a TCP read carries many frames. The
// queue is borrowed from the server's pool while frames wait, so an idle
// connection holds none. TLS connections relay a frame at a time:
// tls.Conn's Read hands over one record, and clients write a frame per
// record, so a queue would hold one frame (measured: no gain).
type streamUps struct {
	q  *upQueue
	on bool // a TCP connection
}

// relayChannelData queues a ChannelData frame from the client for its
// peer. The frame must stay unchanged until flushUp.
func (c *streamConn) relayChannelData(frame []byte) {
	if !c.ups.on {
		c.srv.relayUp(c.t, frame)
		return
	}
	c.upQueue().add(c.srv, c.t, frame)
}

// relaySendIndication queues a Send indication's data for its peer, in
// order with ChannelData, and reports whether msg was one. The message
// must stay unchanged until flushUp.
func (c *streamConn) relaySendIndication(msg []byte) bool {
	if !c.ups.on || !isSendIndication(msg) {
		return c.srv.relaySend(c.t, msg)
	}
	c.upQueue().addSend(c.srv, c.t, msg)
	return true
}

// upQueue is the connection's queue with room for one more frame,
// borrowed from the server's pool when it has none.
func (c *streamConn) upQueue() *upQueue {
	u := c.ups.q
	if u == nil {
		u, _ = c.srv.upQueues.Get().(*upQueue)
		if u == nil {
			u = newUpQueue()
		}
		c.ups.q = u
	}
	if u.n == len(u.ups) {
		u.flush(c.srv)
	}
	return u
}

// batchUp turns the queue on (a TCP connection).
func (c *streamConn) batchUp() { c.ups.on = true }

// flushUp sends what is queued and gives the queue back.
func (c *streamConn) flushUp() {
	u := c.ups.q
	if u == nil {
		return
	}
	u.flush(c.srv)
	c.ups.q = nil
	c.srv.upQueues.Put(u)
}
