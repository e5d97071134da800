// Package server runs one protocol handler on one listener with the limits
// an operator expects on every listener: connection caps and accept rate
// (package netlimit, beneath TLS), header-read and idle timeouts, a maximum
// header size, and JSON answers for the errors fasthttp produces itself.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/netlimit"
	"edgerelay/fastpath/park"
)

// Service describes one listener.
type Service struct {
	// Name labels logs and metrics ("channel", "mailbox", ...).
	Name string
	// Addr is host:port to listen on.
	Addr    string
	Handler fasthttp.RequestHandler
	// TLS, when not nil, serves TLS on the listener.
	TLS    *tls.Config
	Limits netlimit.Limits
	// HeaderTimeout bounds reading one request (headers and body).
	HeaderTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection between requests.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers; larger is 431.
	MaxHeaderBytes int
	// MaxBodyBytes bounds request bodies; larger is 413.
	MaxBodyBytes int
	// WriteBufferSize sizes the buffer answers are written through (0:
	// fasthttp's 4 KiB). Answers to pipelined requests collect in it and
	// go out in one write when it fills or the pipeline is drained.
	WriteBufferSize int
	// Drain closes the service's long-lived sockets (WebSockets with 1001)
	// and waits for them; nil when the service has none.
	Drain func(ctx context.Context) error
	// KeepHijackedConns leaves hijacked connections to their handler
	// (which must close them); WebSocket services set it with ws.Options.Detach.
	KeepHijackedConns bool
	// StreamRequestBody hands the handler the body as it arrives, so that
	// it can check credentials before reading it (the push gateway).
	StreamRequestBody bool
	// ErrorHandler answers fasthttp's own refusals; nil keeps the JSON
	// error shape of the other protocols.
	ErrorHandler func(ctx *fasthttp.RequestCtx, err error)
	// AnswerBeforeBody, when set, is asked with each request's headers,
	// before any byte of its body is read, whether the handler will answer
	// from them alone (a refusal); see AnswerBeforeBody and BodyWithheld.
	AnswerBeforeBody func(h *fasthttp.RequestHeader) bool
	// Parker, when not nil, keeps each accepted connection in this set,
	// without a goroutine, a request context or a read buffer, until its
	// first byte (a request line, a TLS ClientHello) or its end arrives;
	// one that sends nothing within HeaderTimeout is closed and counted
	// (netlimit.ReasonSilent). nil (or where park.New fails) serves every
	// connection from its accept. See netlimit.Listener.SetParker.
	//
	// With a Parker, keep-alive connections are parked between requests
	// too: one whose next request has not begun KeepAliveLinger after its
	// last answer waits in the set, without its goroutine, context or
	// buffers, until it does (or until IdleTimeout); a TLS one keeps its
	// TLS state (see netlimit.ParkKeepAlive).
	Parker *park.Set
	// KeepAliveLinger is how long a keep-alive connection keeps its
	// goroutine after an answer before it is parked (0:
	// DefaultKeepAliveLinger).
	KeepAliveLinger time.Duration
}

// DefaultKeepAliveLinger is Service.KeepAliveLinger's default: a client
// that sends its requests one after another keeps its connection's
// goroutine, and a connection left idle is parked after a second, as an
// idle WebSocket is (ws.DefaultParkAfter).
const DefaultKeepAliveLinger = time.Second

// idleWorkerLife is how long fasthttp keeps a goroutine that served a
// connection, for the next, with a Parker (fasthttp's default: 10 s).
// A parked connection gives its goroutine back to that pool: the pool
// lets it go soon after, so that an idle flood costs only its parked
// state within seconds, while connections coming back from the set in a
// busy moment still find warm goroutines.
const idleWorkerLife = 2 * time.Second

// Listener is a running Service.
type Listener struct {
	svc   Service
	srv   *fasthttp.Server
	ln    *netlimit.Listener
	log   *slog.Logger
	errCh chan error
}

// Listen opens the service's socket; Serve starts answering.
func Listen(svc Service, counters netlimit.Counters, log *slog.Logger) (*Listener, error) {
	if err := svc.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("server %s: %w", svc.Name, err)
	}
	raw, err := net.Listen("tcp", svc.Addr)
	if err != nil {
		return nil, fmt.Errorf("server %s: listen %s: %w", svc.Name, svc.Addr, err)
	}
	log = log.With("service", svc.Name)
	limited := netlimit.New(raw, svc.Limits, counters)
	limited.SetLog(log)
	limited.SetParker(svc.Parker, svc.HeaderTimeout)
	if svc.KeepAliveLinger <= 0 {
		svc.KeepAliveLinger = DefaultKeepAliveLinger
	}
	limited.ParkKeepAlive(svc.KeepAliveLinger)
	l := &Listener{svc: svc, ln: limited, log: log, errCh: make(chan error, 1)}
	l.srv = &fasthttp.Server{
		Name:                          "edgerelay",
		Handler:                       svc.Handler,
		ReadTimeout:                   svc.HeaderTimeout,
		IdleTimeout:                   svc.IdleTimeout,
		ReadBufferSize:                svc.MaxHeaderBytes,
		WriteBufferSize:               svc.WriteBufferSize,
		MaxRequestBodySize:            svc.MaxBodyBytes,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 false,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		ErrorHandler:                  errorAnswer,
		StreamRequestBody:             svc.StreamRequestBody,
		KeepHijackedConns:             svc.KeepHijackedConns,
		Logger:                        fasthttpLogger{log: log},
	}
	if svc.Parker != nil {
		l.srv.ConnState = markIdle
		l.srv.MaxIdleWorkerDuration = idleWorkerLife
	}
	if svc.ErrorHandler != nil {
		l.srv.ErrorHandler = svc.ErrorHandler
	}
	if svc.AnswerBeforeBody != nil {
		AnswerBeforeBody(l.srv, svc.AnswerBeforeBody)
	}
	return l, nil
}

// markIdle tells netlimit when fasthttp is between two requests on a
// connection, the only time it parks a keep-alive connection. The end of
// a connection is not told: fasthttp's worker reports it after the Close
// that parked the connection, when it may already be served again.
func markIdle(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateIdle:
		netlimit.MarkIdle(c, true)
	case fasthttp.StateActive, fasthttp.StateHijacked:
		netlimit.MarkIdle(c, false)
	}
}

// Refusal classifies an error fasthttp hands an ErrorHandler (it refused
// the request before any handler ran) into the status to answer and a
// message: 431 for headers over MaxHeaderBytes, 413 for a body over
// MaxBodyBytes, 408 for a client too slow for HeaderTimeout, 400 for
// anything else. Each protocol writes them in its own error shape.
func Refusal(err error) (status int, message string) {
	var tooBig *fasthttp.ErrSmallBuffer
	var te interface{ Timeout() bool }
	switch {
	case errors.As(err, &tooBig):
		return fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers too large"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "request body too large"
	case errors.As(err, &te) && te.Timeout():
		return fasthttp.StatusRequestTimeout, "request timeout"
	}
	return fasthttp.StatusBadRequest, "malformed request"
}

// errorAnswer answers fasthttp's own refusals in the {"error":"<message>"}
// shape of the private channel relay and the admin listener.
func errorAnswer(ctx *fasthttp.RequestCtx, err error) {
	status, msg := Refusal(err)
	httpx.Error(ctx, status, msg)
}

// Addr is the address actually listened on (useful with port 0).
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Limited is the connection-limiting listener, for metrics.
func (l *Listener) Limited() *netlimit.Listener { return l.ln }

// Name is the service name.
func (l *Listener) Name() string { return l.svc.Name }

// Serve answers requests until Shutdown; it returns nil after a Shutdown.
func (l *Listener) Serve() error {
	var ln net.Listener = l.ln
	if l.svc.TLS != nil {
		ln = l.ln.TLS(l.svc.TLS) // keep-alive connections park with their TLS
	}
	err := l.srv.Serve(ln)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("server %s: %w", l.svc.Name, err)
	}
	return nil
}

// Shutdown stops accepting, closes the service's WebSockets with 1001 and
// waits for in-flight requests and socket writers until ctx ends.
//
// The WebSocket drain and fasthttp's own shutdown (which waits for the
// requests in flight and answers them with Connection: close) run side by
// side, so that each has the whole of ctx: a socket slow to take its close
// frame does not spend the time a held request needs, nor the reverse.
func (l *Listener) Shutdown(ctx context.Context) error {
	var errs []error
	// Stop accepting first so that no new socket appears behind the drain.
	if err := l.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, fmt.Errorf("server %s: close listener: %w", l.svc.Name, err))
	}
	drained := make(chan error, 1)
	go func() {
		if l.svc.Drain == nil {
			drained <- nil
			return
		}
		if err := l.svc.Drain(ctx); err != nil {
			drained <- fmt.Errorf("server %s: drain: %w", l.svc.Name, err)
			return
		}
		drained <- nil
	}()
	// fasthttp closes the listener again and reports that it already was.
	if err := l.srv.ShutdownWithContext(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, fmt.Errorf("server %s: shutdown: %w", l.svc.Name, err))
	}
	if err := <-drained; err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// fasthttpLogger sends fasthttp's connection-level errors (garbage from a
// client, resets) to the structured log at debug level: they are the
// client's fault and would flood an operator's log otherwise.
type fasthttpLogger struct{ log *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.log.Debug(fmt.Sprintf(format, args...))
}
