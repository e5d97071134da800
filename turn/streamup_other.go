//go:build !linux

package turn

// streamUps is empty on this system: ChannelData from a stream client is
// relayed a frame at a time (Linux queues a read's worth:
// streamup_linux.go).
type streamUps struct{}

// relayChannelData relays a ChannelData frame from the client to its peer.
func (c *streamConn) relayChannelData(frame []byte) { c.srv.relayUp(c.t, frame) }

// relaySendIndication relays a Send indication's data to its peer and
// reports whether msg was one.
func (c *streamConn) relaySendIndication(msg []byte) bool { return c.srv.relaySend(c.t, msg) }

// batchUp does nothing here.
func (c *streamConn) batchUp() {}

// flushUp has nothing to send.
func (c *streamConn) flushUp() {}
