// Package ws is the server side of RFC 6455 that every relay protocol
// shares: the upgrade on a fasthttp request, a frame reader that reuses one
// message buffer, and a connection with one writer goroutine at a time fed
// by a send queue bounded in bytes. The writer runs only while something is
// queued (pings come from a timer), and with a Parker an idle socket's
// reader gives its goroutine back too (park.go): an idle socket holds none.
//
// Why not fasthttp/websocket's Conn on the server: its reader allocates a
// message reader per message and its writer is called from whichever
// goroutine sends, which would put a slow peer's socket write on the
// forwarding goroutine of another peer. Here the forwarding goroutine only
// copies bytes into the destination's queue (no allocation once the queue
// buffers have grown), and the destination's own writer flushes everything
// queued in one write. fasthttp/websocket stays the client in tests and in
// the SDK, so the framing is checked against an independent implementation.
package ws

// Opcodes of RFC 6455 section 5.2.
const (
	OpContinuation = 0x0
	OpText         = 0x1
	OpBinary       = 0x2
	OpClose        = 0x8
	OpPing         = 0x9
	OpPong         = 0xA
)

// Close codes used by the relay protocols.
const (
	CloseNormal          = 1000
	CloseGoingAway       = 1001
	CloseProtocolError   = 1002
	CloseUnsupportedData = 1003
	CloseNoStatus        = 1005
	CloseInvalidPayload  = 1007
	ClosePolicyViolation = 1008
	CloseTooBig          = 1009
	CloseInternalError   = 1011
	CloseTryAgainLater   = 1013
	// CloseReplaced is the application code a socket gets when a newer
	// socket takes its place.
	CloseReplaced = 4000
)
