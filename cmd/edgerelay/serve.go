package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/cors"
	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/mailbox"
	"edgerelay/fastpath/netlimit"
	"edgerelay/fastpath/pushgw"
	"edgerelay/fastpath/ratelog"
	"edgerelay/fastpath/server"
	"edgerelay/fastpath/tlsconf"
	"edgerelay/fastpath/ws"
	"edgerelay/push/apns"
	"edgerelay/push/fcm"
	"edgerelay/store"
	"edgerelay/store/cluster"
	"edgerelay/turn"
)

// adminTokenFile is where serve leaves the admin token for the command
// line, inside the data dir, readable by the data dir's owner only.
const adminTokenFile = "admin.token"

// bootstrapFile holds the v1 setup key: the claim key of host "default".
const bootstrapFile = "bootstrap.secret"

func runServe(args []string, stdout, stderr io.Writer) int {
	values, err := config.Load(args, os.Environ(), stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay serve: %v\n", err)
		return 2
	}
	cfg, err := values.Config()
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay serve: %v\n", err)
		return 2
	}
	if cfg, err = applyDemo(cfg); err != nil {
		fmt.Fprintf(stderr, "edgerelay serve: %v\n", err)
		return 2
	}
	// Repeated warnings and errors (a store refusing every write, a
	// background job failing in a loop) are bounded per message.
	log := slog.New(ratelog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}), ratelog.Config{}))
	// Two Ps at least, so that a synced commit does not stall every
	// request on a one-core machine (see store.MinProcs).
	procs, _ := store.EnsureProcs()
	if unknown := values.UnknownEnv(); len(unknown) > 0 {
		log.Warn("unknown RELAY_* environment variables ignored", "names", unknown)
	}
	log.Info("starting", "version", version(), "gomaxprocs", procs, "settings", values)

	// SIGTERM while a cluster node waits for its NATS ends the wait.
	startCtx, startDone := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	r, err := startRelay(startCtx, cfg, log, stdout)
	startDone()
	if err != nil {
		log.Error("start failed", "err", err)
		fmt.Fprintf(stderr, "edgerelay serve: %v\n", err)
		return 1
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				r.reloadTLS()
				continue
			}
			log.Info("draining", "signal", sig.String(), "bound", cfg.DrainTimeout.String())
			incomplete, closeErr := r.stopWithin(cfg.DrainTimeout)
			return stopCode(log, incomplete, closeErr)
		case err := <-r.failed:
			log.Error("listener failed", "err", err)
			_, _ = r.stopWithin(cfg.DrainTimeout)
			return 1
		}
	}
}

// relay is every running part of one serve process.
type relay struct {
	cfg       config.Config
	log       *slog.Logger
	db        *store.DB
	cluster   *cluster.Cluster // nil: a single node
	admin     *admin.Handler
	listeners []*server.Listener
	reloaders []*tlsconf.Reloader
	// acme is the certificate source of the listeners with Listener.ACME;
	// nil when RELAY_ACME_DOMAINS is not set.
	acme   *tlsconf.ACME
	failed chan error
	// stopBackground ends the services' background loops.
	stopBackground []context.CancelFunc
	// closers release what the services' stores hold (cluster watches),
	// after the listeners and before the cluster connection.
	closers []func() error
	turn    *turn.Server
	// parker holds the idle WebSockets of every service (RELAY_WS_PARK);
	// nil: a reader goroutine per socket.
	parker *ws.Parker
}

func startRelay(ctx context.Context, cfg config.Config, log *slog.Logger, stdout io.Writer) (r *relay, err error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	db, err := store.OpenOptions(cfg.DataDir, log, store.Options{DiskReserve: uint64(cfg.DiskReserve)})
	if err != nil {
		return nil, err
	}
	// Every early return below hands back a nil relay: release what was
	// opened through this reference.
	opened := &relay{cfg: cfg, log: log, db: db, failed: make(chan error, 8)}
	r = opened
	defer func() {
		if err != nil {
			_ = opened.closeAll()
		}
	}()

	unavailable := db.Unavailable
	if cfg.Cluster.On() {
		if r.cluster, err = openCluster(ctx, cfg, log); err != nil {
			return nil, err
		}
		unavailable = r.unavailable
		if cfg.Listeners[config.Agent].On() {
			if err := clusterAgentKey(ctx, r.cluster, cfg.DataDir); err != nil {
				return nil, err
			}
		}
	}

	if cfg.ACME.On() {
		if r.acme, err = newACME(cfg, log); err != nil {
			return nil, err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := admin.RegisterStorage(reg, unavailable); err != nil {
		return nil, err
	}
	if err := db.RegisterMetrics(reg); err != nil {
		return nil, err
	}
	if r.cluster != nil {
		if err := r.cluster.RegisterMetrics(reg); err != nil {
			return nil, err
		}
	}
	listenerMetrics, err := netlimit.NewPromMetrics(reg)
	if err != nil {
		return nil, err
	}
	if r.parker, err = startParker(cfg, reg, log); err != nil {
		return nil, err
	}

	var services []server.Service
	var keys *channel.Keys
	lines := map[config.Service]string{}
	if l := cfg.Listeners[config.Channel]; l.On() {
		claims, forgotten, err := r.channelClaims(ctx)
		if err != nil {
			return nil, err
		}
		clog := log.With("service", "channel")
		chRoute, err := r.channelRoute(ctx, clog)
		if err != nil {
			return nil, err
		}
		h := channel.New(channel.Config{Claims: claims, Route: chRoute, Log: clog, Metrics: channel.NewMetrics(reg), DetachSockets: true, Parker: r.parker})
		if err := forgotten(h.Forget); err != nil {
			return nil, err
		}
		keys = &channel.Keys{Claims: claims, Handler: h}
		if err := loadBootstrap(cfg.DataDir, keys, log); err != nil {
			return nil, err
		}
		svc := r.service(string(config.Channel), l, h.ServeHTTP, h.Drain)
		svc.MaxBodyBytes = 64 << 10
		svc.KeepHijackedConns = true
		services = append(services, svc)
		lines[config.Channel] = "add a computer: edgerelay keys channel add --host NAME (prints its claim key)"
	}
	// TURN starts before the mailbox: ice names the port TURN was given
	// (a listen address with port 0 has none before).
	if l := cfg.Listeners[config.TURN]; l.On() {
		if err := r.startTURN(cfg, l, reg, lines); err != nil {
			return nil, err
		}
	}
	pushers := loadPushers(cfg, log)
	if l := cfg.Listeners[config.Mailbox]; l.On() {
		apps, err := mailbox.ParseApps(cfg.Mailbox.Apps)
		if err != nil {
			return nil, err
		}
		mlog := log.With("service", "mailbox")
		mailboxes, err := r.mailboxes(ctx, cfg, db, mlog)
		if err != nil {
			return nil, err
		}
		h, err := mailbox.New(mailbox.Config{
			Store: mailboxes, Apps: apps, Log: mlog,
			SweepEvery: min(cfg.Mailbox.Idle/4, time.Minute), MaxEnvelope: cfg.Mailbox.MaxEnvelope,
			Metrics: mailbox.NewMetrics(reg), ICE: iceConfig(cfg, r.turn), Push: pushers, DetachSockets: true, Parker: r.parker,
			Signals: r.signals(), CORS: cors.New(cfg.CORS, mailbox.CORSRules()),
		})
		if err != nil {
			return nil, err
		}
		bg, stop := context.WithCancel(context.Background())
		r.stopBackground = append(r.stopBackground, stop)
		go h.Run(bg)
		svc := r.service(string(config.Mailbox), l, h.ServeHTTP, h.Drain)
		svc.MaxBodyBytes = cfg.Mailbox.MaxEnvelope + 4096
		svc.KeepHijackedConns = true
		svc.WriteBufferSize = mailbox.WriteBufferSize
		svc.ErrorHandler = h.ServeError
		services = append(services, svc)
		names := make([]string, 0, len(apps))
		for n := range apps {
			names = append(names, n)
		}
		sort.Strings(names)
		if len(names) == 0 {
			lines[config.Mailbox] = "no apps: set RELAY_APPS (e.g. RELAY_APPS=\"notes;chat:push=com.example.chat,signal,ice\")"
		} else {
			lines[config.Mailbox] = "apps " + strings.Join(names, ", ") + " under /v1/<app>/mailbox/<id>"
		}
	}
	pushKeys, err := r.startPushGateway(ctx, cfg, pushers, reg, &services, lines)
	if err != nil {
		return nil, err
	}
	agentKeys, agentPub, err := r.startAgent(ctx, cfg, reg, &services, lines)
	if err != nil {
		return nil, err
	}

	token, err := writeAdminToken(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var pushAdmin *pushgw.Admin
	if len(pushKeys) > 0 {
		pushAdmin = pushgw.NewAdmin(pushKeys)
	}
	r.admin = admin.New(admin.Config{
		Gatherer: reg, TokenHash: httpx.Hash([]byte(token)), ChannelKeys: keys, PushKeys: pushAdmin,
		AgentKeys: agentKeys, AgentPublicKey: agentPub, Storage: unavailable, Log: log.With("service", "admin"),
		Backup: serverBackup(db, r.cluster != nil),
	})
	demoOff := ""
	if cfg.Demo.On && cfg.Demo.Listen != "" {
		if h, err := demoHandler(cfg.Demo.Dir); err != nil {
			demoOff = err.Error()
		} else {
			services = append(services, r.service(string(demoService), config.Listener{Addr: cfg.Demo.Listen}, h, nil))
			lines[demoService] = "the example app: open http://" + cfg.Demo.Listen + "/examples/chat/ in two windows (mailbox app demo with signal and ice, TURN)"
		}
	}
	if cfg.ACME.HTTPListen != "" && r.acme != nil {
		// Plain HTTP by its nature (the CA asks port 80), with the caps
		// of every listener: it is on the open internet.
		svc := r.service(string(acmeService), config.Listener{Addr: cfg.ACME.HTTPListen}, fasthttpadaptor.NewFastHTTPHandler(r.acme.HTTPHandler()), nil)
		svc.MaxBodyBytes = 4 << 10
		services = append(services, svc)
		lines[acmeService] = "HTTP-01 challenges for " + strings.Join(cfg.ACME.Domains, ", ") + "; other requests are redirected to https"
	}
	if cfg.AdminListen != "" {
		// The same caps as every other listener: the admin listener is
		// loopback by default, but nothing stops an operator from exposing it.
		svc := r.service("admin", config.Listener{Addr: cfg.AdminListen}, r.admin.ServeHTTP, nil)
		svc.MaxBodyBytes = 64 << 10
		services = append(services, svc)
	}

	warnOpenFiles(log, services)
	tlsOn := map[string]bool{}
	for i := range services {
		svc := services[i]
		if svc.TLS == nil && svc.Name != "admin" {
			if l := cfg.Listeners[config.Service(svc.Name)]; l.ACME {
				svc.TLS = r.acme.ServerConfig(false)
			} else if l.TLS() {
				rl, err := tlsconf.NewReloader(l.CertFile, l.KeyFile)
				if err != nil {
					return nil, fmt.Errorf("%s TLS: %w", svc.Name, err)
				}
				r.reloaders = append(r.reloaders, rl)
				svc.TLS = tlsconf.ServerConfig(rl, false)
			}
		}
		tlsOn[svc.Name] = svc.TLS != nil
		ln, err := server.Listen(svc, listenerMetrics.For(svc.Name), log)
		if err != nil {
			return nil, err
		}
		if err := listenerMetrics.TrackOpen(svc.Name, ln.Limited()); err != nil {
			_ = ln.Shutdown(context.Background())
			return nil, err
		}
		r.listeners = append(r.listeners, ln)
	}
	for _, ln := range r.listeners {
		go func() {
			if err := ln.Serve(); err != nil {
				r.failed <- err
			}
		}()
	}
	r.admin.SetReady(true)
	if r.acme != nil {
		// Now that the listeners answer TLS-ALPN-01 (and HTTP-01), so the
		// first clients find the certificates ready, and a CA that cannot
		// validate shows in the log at start rather than at the first
		// client. A failure is tried again at the next handshake.
		bg, stop := context.WithCancel(context.Background())
		r.stopBackground = append(r.stopBackground, stop)
		go r.acme.Prefetch(bg, cfg.ACME.Domains)
	}

	for _, ln := range r.listeners {
		scheme := "http"
		if tlsOn[ln.Name()] {
			scheme = "https"
		}
		what := lines[config.Service(ln.Name())]
		if ln.Name() == "admin" {
			what = "/metrics, /healthz, /readyz and key management for the command line"
		}
		fmt.Fprintf(stdout, "%-9s listening on %s://%s — %s\n", ln.Name()+":", scheme, ln.Addr(), what)
		log.Info("listening", "service", ln.Name(), "addr", ln.Addr().String(), "scheme", scheme)
	}
	if demoOff != "" {
		fmt.Fprintf(stdout, "%-9s off: %s\n", string(demoService)+":", demoOff)
	}
	for _, s := range config.Services() {
		if msg, ok := lines[s]; ok && s != config.Channel && s != config.Mailbox && s != config.PushFCM && s != config.PushAPNs && s != config.Agent {
			fmt.Fprintf(stdout, "%-9s %s\n", string(s)+":", msg)
		} else if !cfg.Listeners[s].On() {
			fmt.Fprintf(stdout, "%-9s off (empty listen address)\n", string(s)+":")
		}
	}
	return r, nil
}

// service builds a protocol listener's description from the settings.
func (r *relay) service(name string, l config.Listener, h fasthttp.RequestHandler, drain func(context.Context) error) server.Service {
	lim := r.cfg.Limits
	return server.Service{
		Name: name, Addr: l.Addr, Handler: h, Drain: drain,
		Limits: netlimit.Limits{
			MaxConns: lim.MaxConns, MaxConnsPerIP: lim.MaxConnsPerIP,
			AcceptRate: float64(lim.AcceptRate), AcceptBurst: lim.AcceptBurst,
		},
		HeaderTimeout: lim.HeaderTimeout, IdleTimeout: lim.IdleTimeout, MaxHeaderBytes: lim.MaxHeaderBytes,
		// Accepted connections wait without a goroutine until their
		// first byte, in the set the WebSockets park in.
		Parker: r.parker,
	}
}

// reloadTLS re-reads every configured certificate (SIGHUP); open
// connections keep the certificate they started with.
func (r *relay) reloadTLS() {
	for _, rl := range r.reloaders {
		if err := rl.Reload(); err != nil {
			r.log.Error("certificate reload failed; keeping the old one", "err", err)
			continue
		}
		r.log.Info("certificate reloaded", "not_after", rl.Leaf().NotAfter)
	}
}

// stopCode logs the end of a drain and returns serve's exit code. A drain
// that did not finish within its bound (a client held a request or a
// socket open) is a clean stop all the same: every acknowledged write is
// in the store, and the exit closes what was left. Only a store that did
// not close cleanly makes the stop a failure.
func stopCode(log *slog.Logger, incomplete, closeErr error) int {
	if incomplete != nil {
		log.Warn("drain incomplete; the exit closes what is left", "err", incomplete)
	}
	if closeErr != nil {
		log.Error("stop failed", "err", closeErr)
		return 1
	}
	log.Info("stopped")
	return 0
}

// closeReserve is the part of the drain bound kept for closing the store
// after the services have drained: a fifth of it, at most a second.
func closeReserve(bound time.Duration) time.Duration { return min(bound/5, time.Second) }

// stopWithin is shutdown held to bound whatever happens: the services drain
// until bound less closeReserve, and a store that cannot close by bound (a
// failing disk holding a sync) is left to the exit. Every acknowledged write
// was synced before it was acknowledged, so the exit loses none.
func (r *relay) stopWithin(bound time.Duration) (incomplete, closeErr error) {
	done := make(chan [2]error, 1)
	go func() {
		incomplete, closeErr := r.shutdown(bound - closeReserve(bound))
		done <- [2]error{incomplete, closeErr}
	}()
	select {
	case errs := <-done:
		return errs[0], errs[1]
	case <-time.After(bound):
		return nil, fmt.Errorf("stop: the store did not close within the drain bound (%v); exiting, every acknowledged write is synced", bound)
	}
}

// shutdown drains every service within bound, then closes the store.
// incomplete is what the drain did not finish; closeErr a failed close.
//
// Every service stops accepting and drains at the same moment, under one
// deadline: TURN waiting for its allocations (which a closed browser tab
// can leave behind for minutes) must not keep the HTTP listeners open, nor
// spend the deadline that their WebSockets' 1001 closes need.
func (r *relay) shutdown(bound time.Duration) (incomplete, closeErr error) {
	r.admin.SetReady(false)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	drains := make([]func(context.Context) error, 0, len(r.listeners)+1)
	for _, ln := range r.listeners {
		drains = append(drains, ln.Shutdown)
	}
	if r.turn != nil {
		// turn.Server's errors name it already.
		drains = append(drains, r.turn.Shutdown)
		r.turn = nil
	}
	done := make(chan error, len(drains))
	for _, drain := range drains {
		go func() { done <- drain(ctx) }()
	}
	var errs []error
	for range drains {
		if err := <-done; err != nil {
			errs = append(errs, err)
		}
	}
	r.listeners = nil
	closeErr = r.closeAll()
	return errors.Join(errs...), closeErr
}

func (r *relay) closeAll() error {
	for _, stop := range r.stopBackground {
		stop()
	}
	var errs []error
	if r.turn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		errs = append(errs, r.turn.Shutdown(ctx))
		cancel()
	}
	for _, ln := range r.listeners {
		errs = append(errs, ln.Shutdown(context.Background()))
	}
	_ = os.Remove(filepath.Join(r.cfg.DataDir, adminTokenFile))
	for _, c := range r.closers {
		errs = append(errs, c())
	}
	if r.parker != nil {
		errs = append(errs, r.parker.Close())
	}
	if r.cluster != nil {
		errs = append(errs, r.cluster.Close())
	}
	errs = append(errs, r.db.Close())
	return errors.Join(errs...)
}

// writeAdminToken makes a fresh admin token for this process and leaves it
// in the data dir (0600) for the command line. It is a session credential:
// a restart replaces it, and a clean stop removes it.
func writeAdminToken(dataDir string) (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	tok := hex.EncodeToString(raw[:])
	path := filepath.Join(dataDir, adminTokenFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	return tok, nil
}

// loadBootstrap stores the hash of <data dir>/bootstrap.secret, when that
// file exists, as the claim key of host "default" (the v1 setup).
func loadBootstrap(dataDir string, keys *channel.Keys, log *slog.Logger) error {
	raw, err := os.ReadFile(filepath.Join(dataDir, bootstrapFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bootstrap.secret: %w", err)
	}
	if err := keys.AddExisting("default", strings.TrimSpace(string(raw))); err != nil {
		return fmt.Errorf("bootstrap.secret: %w", err)
	}
	log.Info("bootstrap.secret loaded as the claim key of host default")
	return nil
}

// iceConfig points the mailbox ice endpoint at the built-in TURN server
// (REST credentials under RELAY_TURN_SECRET, advertised at
// RELAY_TURN_RELAY_IP or the TURN listen address) and at Cloudflare when
// its key is set.
func iceConfig(cfg config.Config, builtin *turn.Server) mailbox.ICEConfig {
	ice := mailbox.ICEConfig{
		CloudflareKeyID: cfg.Cloudflare.KeyID,
		CloudflareToken: cfg.Cloudflare.APIToken.Reveal(),
		CloudflareURL:   cfg.Cloudflare.URL,
	}
	if secret := cfg.TURN.Secret.Reveal(); secret != "" && builtin != nil {
		turnAddr := builtin.Addr().String()
		host, port, err := net.SplitHostPort(turnAddr)
		if err == nil {
			if cfg.TURN.RelayIP.IsValid() {
				host = cfg.TURN.RelayIP.String()
			}
			hp := net.JoinHostPort(host, port)
			ice.Secret = secret
			ice.URLs = []string{"stun:" + hp, "turn:" + hp + "?transport=udp", "turn:" + hp + "?transport=tcp"}
		}
	}
	return ice
}

// loadPushers loads each push module whose credentials are configured. A
// module that is not configured, or whose credentials do not load, is not
// loaded: its registrations are kept and nothing is sent (logged, so the
// operator sees why).
func loadPushers(cfg config.Config, log *slog.Logger) mailbox.Pushers {
	var p mailbox.Pushers
	if a := cfg.APNs; a.KeyFile != "" || a.KeyID != "" || a.TeamID != "" {
		c, err := apns.New(apns.Config{KeyFile: a.KeyFile, KeyID: a.KeyID, TeamID: a.TeamID, Environment: a.Environment, BaseURL: a.URL})
		if err != nil {
			log.Error("APNs module not loaded", "err", err)
		} else {
			p.APNs = c
			log.Info("APNs module loaded", "environment", a.Environment)
		}
	}
	if f := cfg.FCM; f.Credentials != "" {
		c, err := fcm.New(fcm.Config{CredentialsFile: f.Credentials, BaseURL: f.URL})
		if err != nil {
			log.Error("FCM module not loaded", "err", err)
		} else {
			p.FCM = c
			log.Info("FCM module loaded", "project", c.ProjectID())
		}
	}
	return p
}

// startTURN runs the built-in STUN/TURN server. Without RELAY_TURN_SECRET
// it cannot authenticate anyone, so it stays off and says so.
func (r *relay) startTURN(cfg config.Config, l config.Listener, reg prometheus.Registerer, lines map[config.Service]string) error {
	secret := cfg.TURN.Secret.Reveal()
	if secret == "" {
		lines[config.TURN] = "off: set RELAY_TURN_SECRET (the coturn REST shared secret) to run STUN/TURN on " + l.Addr
		return nil
	}
	tc := turn.Config{
		Listen: l.Addr, Secret: secret, Realm: cfg.TURN.Realm, RelayIP: cfg.TURN.RelayIP,
		AllowPeers: cfg.TURN.AllowPeers, Log: r.log.With("service", "turn"), Metrics: reg,
		SocketBuffer: cfg.TURN.SocketBuffer,
	}
	if l.ACME || l.TLS() {
		if l.ACME {
			tc.TLS = r.acme.ServerConfig(false)
		} else {
			rl, err := tlsconf.NewReloader(l.CertFile, l.KeyFile)
			if err != nil {
				return fmt.Errorf("turn TLS: %w", err)
			}
			r.reloaders = append(r.reloaders, rl)
			tc.TLS = tlsconf.ServerConfig(rl, false)
		}
		var err error
		if tc.TLSListen, err = turnsListen(l.Addr); err != nil {
			return err
		}
	}
	srv, err := turn.Start(tc)
	if err != nil {
		return err
	}
	r.turn = srv
	line := fmt.Sprintf("listening on udp+tcp %s, realm %q; REST credentials from RELAY_TURN_SECRET", srv.Addr(), cfg.TURN.Realm)
	if a := srv.TLSAddr(); a != nil {
		line += fmt.Sprintf(", turns: on %s", a)
	}
	lines[config.TURN] = line
	r.log.Info("listening", "service", "turn", "addr", srv.Addr().String())
	return nil
}

// turnsListen is the turns: address beside TURN's listen address: the
// standard ports 3478 and 5349 keep their distance, so 3478 gives 5349 and
// 3479 gives 5350; port 0 gives 0 (any free port).
func turnsListen(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("turn listen address: %w", err)
	}
	p, _ := strconv.Atoi(port)
	if p != 0 {
		p += 5349 - 3478
	}
	if p > 65535 {
		return "", fmt.Errorf("%s=%s: its turns: port would be %d (the port plus %d), past 65535: choose a port up to %d", config.TURN.ListenEnv(), addr, p, 5349-3478, 65535-(5349-3478))
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// startPushGateway adds the gateway mounts (one provider each) whose
// listeners are on, sharing one key store unless RELAY_PUSH_SEPARATE_KEYS.
// It returns the key management of each mount for the admin listener.
func (r *relay) startPushGateway(ctx context.Context, cfg config.Config, pushers mailbox.Pushers, reg prometheus.Registerer, services *[]server.Service, lines map[config.Service]string) (map[string]*pushgw.Keys, error) {
	mounts := []struct {
		service  config.Service
		provider string
		scope    store.PushScope
	}{
		{config.PushFCM, pushgw.ProviderFCM, store.PushScopeFCM},
		{config.PushAPNs, pushgw.ProviderAPNs, store.PushScopeAPNs},
	}
	keys := map[string]*pushgw.Keys{}
	var shared store.PushGatewayStore
	var metrics *pushgw.Metrics
	for _, m := range mounts {
		l := cfg.Listeners[m.service]
		if !l.On() {
			continue
		}
		if metrics == nil {
			metrics = pushgw.NewMetrics(reg)
		}
		var st store.PushGatewayStore
		var err error
		switch {
		case cfg.Gateway.SeparateKeys:
			st, err = r.pushGatewayStore(ctx, m.scope)
		case shared == nil:
			shared, err = r.pushGatewayStore(ctx, store.PushScopeShared)
			st = shared
		default:
			st = shared
		}
		if err != nil {
			return nil, err
		}
		gcfg := pushgw.Config{
			Provider: m.provider, APNs: pushers.APNs, APNsTopic: cfg.APNs.Topic, APNsEnvironment: cfg.APNs.Environment,
			FCM: pushers.FCM, Store: st, Registration: cfg.Gateway.Registration, RatePerMinute: cfg.Gateway.RatePerMinute,
			DailyBudget: cfg.Gateway.DailyBudget, Metered: cfg.Gateway.Metered, TrustedProxyHeader: cfg.Gateway.TrustedProxyHeader,
			// Its spec wants one log line per request: not limited.
			Log: ratelog.Unlimited(r.log).With("service", string(m.service)), Metrics: metrics,
		}
		h, err := pushgw.New(gcfg)
		if err != nil {
			return nil, err
		}
		svc := r.service(string(m.service), l, h.ServeHTTP, h.Drain)
		svc.MaxBodyBytes = pushgw.MaxBodyBytes
		svc.StreamRequestBody = true
		svc.ErrorHandler = h.ServeError
		svc.AnswerBeforeBody = h.AnswersFromHeaders
		*services = append(*services, svc)
		keys[m.provider] = &pushgw.Keys{Store: st, Log: r.log.With("service", string(m.service))}
		ready := "provider configured"
		if (m.provider == pushgw.ProviderFCM && pushers.FCM == nil) || (m.provider == pushgw.ProviderAPNs && (pushers.APNs == nil || cfg.APNs.Topic == "")) {
			ready = "provider NOT configured (answers 500 relay not configured): see RELAY_" + strings.ToUpper(m.provider) + "_* settings"
		}
		lines[m.service] = "POST /send with an API key (edgerelay keys push create --label L); " + ready
	}
	return keys, nil
}

// startAgent adds the agent relay's listener: always TLS 1.3 (the
// connector refuses anything else), with the certificates from the ACME CA,
// the configured certificate, or a development one generated into the data
// dir. It returns the operator's
// key management and the relay's public key for the admin listener.
func (r *relay) startAgent(ctx context.Context, cfg config.Config, reg prometheus.Registerer, services *[]server.Service, lines map[config.Service]string) (*agent.Keys, string, error) {
	l := cfg.Listeners[config.Agent]
	if !l.On() {
		return nil, "", nil
	}
	key, err := agent.LoadOrCreateKey(cfg.DataDir)
	if err != nil {
		return nil, "", err
	}
	st, revoked, err := r.agentRecords(ctx)
	if err != nil {
		return nil, "", err
	}
	h, err := r.newAgent(ctx, agent.Config{Store: st, Key: key, RelayName: "edgerelay", Log: r.log.With("service", "agent"), Metrics: agent.NewMetrics(reg),
		InstanceQueue: cfg.Agent.InstanceQueue, CORS: cors.New(cfg.CORS, agent.CORSRules())})
	if err != nil {
		return nil, "", err
	}
	if err := revoked(h.Revoked); err != nil {
		return nil, "", err
	}
	svc := r.service(string(config.Agent), l, h.ServeHTTP, h.Drain)
	svc.MaxBodyBytes = 64 << 10
	svc.ErrorHandler = h.ServeError
	line := "relay key " + h.PublicKey() + "; pair a runtime: edgerelay keys agent account add NAME, then edgerelay keys agent pair-key NAME"
	if l.ACME {
		svc.TLS = r.acme.ServerConfig(true)
		*services = append(*services, svc)
		lines[config.Agent] = line + "; certificates from ACME for " + strings.Join(cfg.ACME.Domains, ", ")
		return &agent.Keys{Store: st, Handler: h}, h.PublicKey(), nil
	}
	certFile, keyFile, devCA := l.CertFile, l.KeyFile, ""
	if !l.TLS() {
		var hosts []string
		if host, _, err := net.SplitHostPort(l.Addr); err == nil && host != "" {
			hosts = append(hosts, host)
		}
		dev, err := tlsconf.EnsureDevCert(cfg.DataDir, hosts)
		if err != nil {
			return nil, "", err
		}
		certFile, keyFile, devCA = dev.Cert, dev.Key, dev.CA
	}
	rl, err := tlsconf.NewReloader(certFile, keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("agent TLS: %w", err)
	}
	r.reloaders = append(r.reloaders, rl)
	svc.TLS = tlsconf.ServerConfig(rl, true)
	*services = append(*services, svc)
	if devCA != "" {
		line += "; development certificate, trust its CA at " + devCA
	}
	lines[config.Agent] = line
	return &agent.Keys{Store: st, Handler: h}, h.PublicKey(), nil
}

// envelopeCache maps RELAY_ENVELOPE_CACHE, where 0 keeps no cache, to
// mailbox.Config.EnvelopeCache, where 0 is the default and negative none.
func envelopeCache(bytes int) int {
	if bytes == 0 {
		return -1
	}
	return bytes
}
