package ws

import (
	"net"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// CloseNotifier is a connection that can run a function once it is closed.
// netlimit's connections are, beneath TLS, so every listener of the relay
// hands fasthttp such connections; Hijack needs one to keep its promise.
type CloseNotifier interface {
	// AfterClose registers f to run once, on the goroutine that closes the
	// connection, after it is closed; at once if it already is.
	AfterClose(f func())
}

// Hijack takes the connection of ctx for serve, which writes the answer
// itself (fasthttp writes nothing for this request) and runs on the
// goroutine fasthttp hands the connection to.
//
// fasthttp does not always hand it over: when it cannot flush the answers
// to requests pipelined before this one, or set the connection's
// deadlines, it closes the connection and never calls the hijack handler
// (fasthttp 1.78 server.go, serveConn; nothing it resets or closes on
// that path reaches the request's user values either). A handler that
// reserved something for the socket (a watcher slot, a control-socket
// claim) would never get it back. abandon, when not nil, is the way back:
// exactly one of serve and abandon runs, abandon when the connection is
// closed before fasthttp handed it over. That takes a connection that
// reports its close (CloseNotifier, found through NetConn wrappers such as
// tls.Conn); on any other, abandon never runs and serve runs only if
// fasthttp hands the connection over.
func Hijack(ctx *fasthttp.RequestCtx, abandon func(), serve func(net.Conn)) {
	ho := &handover{abandon: abandon}
	if abandon != nil {
		if n := closeNotifier(ctx.Conn()); n != nil {
			n.AfterClose(ho.giveUp)
		}
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(nc net.Conn) {
		if !ho.take() {
			// Closed before the hand-over (abandon has run): there is
			// nobody to serve.
			_ = nc.Close()
			return
		}
		serve(nc)
	})
}

// A handover decides, once, between serving a hijacked connection and
// abandoning it.
type handover struct {
	state   atomic.Uint32
	abandon func()
}

const (
	waiting uint32 = iota
	served
	abandoned
)

// take claims the connection for serve; false when it was abandoned.
func (h *handover) take() bool {
	if !h.state.CompareAndSwap(waiting, served) {
		return false
	}
	// Only the winner of the swap touches abandon: dropping it here lets
	// what it holds go while the socket lives on.
	h.abandon = nil
	return true
}

// giveUp runs abandon unless serve has the connection.
func (h *handover) giveUp() {
	if h.state.CompareAndSwap(waiting, abandoned) {
		h.abandon()
	}
}

// closeNotifier finds the CloseNotifier under c's wrappers, or nil.
func closeNotifier(c net.Conn) CloseNotifier {
	for range 4 { // tls.Conn over a limited conn is as deep as it gets
		switch v := c.(type) {
		case CloseNotifier:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}
