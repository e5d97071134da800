package idlebench

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"edgerelay/bench/relayserve"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/mailbox"
	"edgerelay/fastpath/netlimit"
	"edgerelay/fastpath/server"
	"edgerelay/fastpath/tlsconf"
	"edgerelay/fastpath/ws"
	"edgerelay/store"
	"edgerelay/store/mailboxlocal"
)

// ServeConfig shapes the server process (cmd/idleserve).
type ServeConfig struct {
	// Park puts a ws.Parker in both handlers' configurations
	// (RELAY_WS_PARK=on); off, every socket keeps its reader goroutine.
	Park bool
	// TLS serves both listeners over TLS with a development certificate
	// made at start-up, as the binary does without RELAY_TLS_CERT.
	TLS bool
	// Mailboxes and Computers are claimed before the listeners open:
	// mailboxes 0..Mailboxes-1 with relayserve.Token, computers with
	// OwnerToken and PhoneToken.
	Mailboxes, Computers int
	// Ping is every socket's ping interval (the mailbox's silence
	// timeout 2.5 times it, as the spec's 30 and 75 s); 0 keeps the
	// handlers' defaults. The benchmarks' clients never answer a ping,
	// so they set it beyond their runs.
	Ping time.Duration
	// Limits are both listeners' connection limits (zero: none, as
	// relayserve serves the relays for the memory figures).
	Limits netlimit.Limits
	// DataDir holds the mailbox store; a temporary directory (on
	// /dev/shm where there is one) when empty.
	DataDir string
	// CountConns makes the count command answer the connections the
	// listeners hold (accepted and not yet closed, WebSockets or not)
	// instead of the handlers' WebSockets: the figures of connections
	// that never upgrade.
	CountConns bool
	// HeaderTimeout replaces the binary's (relayserve.HeaderTimeout, 10
	// s) when set: connections that send nothing are closed after it,
	// which a measurement of thousands of them outlasts.
	HeaderTimeout time.Duration
}

// ServeProcess is the body of cmd/idleserve: the mailbox and private
// channel relays as the binary serves them (fastpath/server, sockets
// detached, the binary's timeouts and header limit; when c.Park one
// ws.Parker shared by both handlers and both listeners, which park
// accepted connections until their first byte), each on a loopback
// listener of its own.
// Then serverproc's commands ("ready <mailbox addr> <channel addr>", then
// gc, usage, mem, heap-profile, …; see serverproc.Serve) and its own:
//
//	count    "ok <n>": the WebSockets both handlers hold
//	parked   "ok <n>": the sockets parked (0 without a parker): WebSockets,
//	         and connections waiting for a first byte (new ones, and
//	         keep-alive ones between requests)
//	refused  "ok <JSON>": connections the listeners refused, by reason,
//	         and those they hold open ({"rate":3,…,"open":10000})
//
// It stops when in ends.
func ServeProcess(c ServeConfig, in io.Reader, out io.Writer) (err error) {
	if _, err := serverproc.RaiseFileLimit(); err != nil {
		return err
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	dir := c.DataDir
	if dir == "" {
		// The wake figure times an envelope PUT: its synced write on a
		// disk would bury the delivery's microseconds under an fsync's
		// milliseconds, so the store lives in memory where it can.
		if dir, err = os.MkdirTemp(shmDir(), "idleserve-"); err != nil {
			return fmt.Errorf("idleserve: %w", err)
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	}
	db, err := store.Open(dir, nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	log := store.NewEnvelopeLog(db)
	if err := claimMailboxes(log, c.Mailboxes); err != nil {
		return err
	}

	var parker *ws.Parker
	if c.Park {
		if parker, err = ws.NewParker(); err != nil {
			return err
		}
		defer parker.Close()
	}
	mailboxes, err := mailboxlocal.New(mailboxlocal.Config{Log: log, Limits: store.DefaultMailboxLimits()})
	if err != nil {
		return err
	}
	mcfg := mailbox.Config{
		Store:         mailboxes,
		Apps:          map[string]mailbox.App{relayserve.App: {Name: relayserve.App, Signal: true}},
		DetachSockets: true,
		Parker:        parker,
	}
	ccfg := channel.Config{Claims: newMemClaims(c.Computers), DetachSockets: true, Parker: parker}
	if c.Ping > 0 {
		mcfg.PingInterval, mcfg.SilenceTimeout = c.Ping, c.Ping*5/2
		ccfg.PingInterval = c.Ping
	}
	mh, err := mailbox.New(mcfg)
	if err != nil {
		return err
	}
	ch := channel.New(ccfg)

	var tlsConf *tlsConfig
	if c.TLS {
		if tlsConf, err = devTLS(dir); err != nil {
			return err
		}
	}
	refusals := &refusalCounts{}
	// Parking, the listeners park accepted connections until their
	// first byte too (server.Service.Parker), in the same set.
	lc := listenConfig{limits: c.Limits, tls: tlsConf, counters: refusals, parker: parker, headerTimeout: c.HeaderTimeout}
	mailboxLn, err := listen(mailboxService(mh), lc)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, mailboxLn.close()) }()
	channelLn, err := listen(channelService(ch), lc)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, channelLn.close()) }()

	return serverproc.Serve(serverproc.ServeOptions{
		Ready: mailboxLn.addr + " " + channelLn.addr,
		Commands: serverproc.Commands{
			"count": func(string) (string, error) {
				if c.CountConns {
					return strconv.Itoa(mailboxLn.l.Limited().Open() + channelLn.l.Limited().Open()), nil
				}
				return strconv.Itoa(mh.Open() + ch.Open()), nil
			},
			"parked": func(string) (string, error) {
				if parker == nil {
					return "0", nil
				}
				waiting := mailboxLn.l.Limited().Waiting() + channelLn.l.Limited().Waiting()
				return strconv.Itoa(parker.Parked() + waiting), nil
			},
			"refused": func(string) (string, error) {
				r := refusals.read()
				r.Open = mailboxLn.l.Limited().Open() + channelLn.l.Limited().Open()
				b, err := json.Marshal(r)
				return string(b), err
			},
		},
	}, in, out)
}

// shmDir is /dev/shm when this machine has it, else the temporary
// directory.
func shmDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", "idleserve-probe-"); err == nil {
			name := f.Name()
			_ = f.Close()
			_ = os.Remove(name)
			return "/dev/shm"
		}
	}
	return ""
}

// claimMailboxes claims mailboxes 0..n-1 with the benchmark bearer straight
// in the store, before the relay runs, many at a time so that their
// synced commits share syncs.
func claimMailboxes(log *store.EnvelopeLog, n int) error {
	hash := store.Hash(sha256.Sum256([]byte(relayserve.Token)))
	return serverproc.ForEach(context.Background(), n, 64, func(i int) error {
		rec := store.MailboxRecord{Token: hash, LastActive: time.Now().UnixNano()}
		return log.Claim(relayserve.App+"/"+relayserve.MailboxID(i), rec, 0, true)
	})
}

// mailboxService and channelService are the listeners as
// relayserve.Mailbox and relayserve.Channel describe them (the binary's),
// here given limits, TLS and a refusal count, which relayserve's do not
// take.
func mailboxService(h *mailbox.Handler) server.Service {
	return server.Service{
		Name:              "mailbox",
		Handler:           h.ServeHTTP,
		KeepHijackedConns: true,
		MaxBodyBytes:      65536 + 4096,
		WriteBufferSize:   mailbox.WriteBufferSize,
		Drain:             h.Drain,
	}
}

func channelService(h *channel.Handler) server.Service {
	return server.Service{
		Name:              "channel",
		Handler:           h.ServeHTTP,
		KeepHijackedConns: true,
		MaxBodyBytes:      64 << 10,
		Drain:             h.Drain,
	}
}

// listener is one running service.
type listener struct {
	l      *server.Listener
	addr   string
	served chan error
}

// listenConfig is what both listeners share.
type listenConfig struct {
	limits        netlimit.Limits
	tls           *tlsConfig // nil: plain
	counters      netlimit.Counters
	parker        *ws.Parker // nil: connections served from their accept
	headerTimeout time.Duration
}

func listen(svc server.Service, c listenConfig) (*listener, error) {
	svc.Addr = relayserve.Loopback
	svc.HeaderTimeout, svc.IdleTimeout, svc.MaxHeaderBytes = relayserve.HeaderTimeout, relayserve.IdleTimeout, relayserve.MaxHeaderBytes
	if c.headerTimeout > 0 {
		svc.HeaderTimeout = c.headerTimeout
	}
	svc.Limits, svc.Parker = c.limits, c.parker
	if c.tls != nil {
		svc.TLS = c.tls.server()
	}
	l, err := server.Listen(svc, c.counters, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("idleserve: %w", err)
	}
	ln := &listener{l: l, addr: l.Addr().String(), served: make(chan error, 1)}
	go func() { ln.served <- l.Serve() }()
	return ln, nil
}

func (ln *listener) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := ln.l.Shutdown(ctx)
	return errors.Join(err, <-ln.served)
}

// Refusals are the connections the listeners refused at accept, by
// netlimit's reasons, and the connections they hold open.
type Refusals struct {
	Total  int64 `json:"total"`
	PerIP  int64 `json:"per_ip"`
	Rate   int64 `json:"rate"`
	FDs    int64 `json:"fds"`
	Silent int64 `json:"silent"` // sent nothing within the header timeout
	Other  int64 `json:"other"`  // a reason this benchmark does not know
	Open   int   `json:"open"`
}

// BeyondRate is the refusals for any reason but the accept rate.
func (r Refusals) BeyondRate() int64 { return r.Total + r.PerIP + r.FDs + r.Silent + r.Other }

// refusalCounts counts refusals for netlimit.
type refusalCounts struct{ total, perIP, rate, fds, silent, other atomic.Int64 }

func (r *refusalCounts) Refused(reason string) {
	switch reason {
	case netlimit.ReasonTotal:
		r.total.Add(1)
	case netlimit.ReasonPerIP:
		r.perIP.Add(1)
	case netlimit.ReasonRate:
		r.rate.Add(1)
	case netlimit.ReasonFDs:
		r.fds.Add(1)
	case netlimit.ReasonSilent:
		r.silent.Add(1)
	default:
		r.other.Add(1)
	}
}

func (r *refusalCounts) read() Refusals {
	return Refusals{Total: r.total.Load(), PerIP: r.perIP.Load(), Rate: r.rate.Load(), FDs: r.fds.Load(),
		Silent: r.silent.Load(), Other: r.other.Load()}
}

// tlsConfig is the listeners' certificate: the development certificate
// the binary makes in its data directory, served through the binary's
// tls.Config (tlsconf.ServerConfig, TLS 1.2 and 1.3).
type tlsConfig struct{ certs *tlsconf.Reloader }

func devTLS(dataDir string) (*tlsConfig, error) {
	paths, err := tlsconf.EnsureDevCert(dataDir, nil)
	if err != nil {
		return nil, fmt.Errorf("idleserve: development certificate: %w", err)
	}
	r, err := tlsconf.NewReloader(paths.Cert, paths.Key)
	if err != nil {
		return nil, fmt.Errorf("idleserve: %w", err)
	}
	return &tlsConfig{certs: r}, nil
}

func (t *tlsConfig) server() *tls.Config { return tlsconf.ServerConfig(t.certs, false) }
