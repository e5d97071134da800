package natsembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ClusterName is the NATS cluster name every embedded server uses. Servers with
// different cluster names refuse each other's routes, so it is fixed rather than
// a setting: one more value operators would have to keep equal on every node.
const ClusterName = "edgerelay"

// syncIntervalAlways is what nats-server's config parser stores for
// `sync_interval: always` (server/opts.go): the 2-minute default interval stays
// as the timer and SyncAlways makes every write fsync before it is acknowledged.
const syncIntervalAlways = 2 * time.Minute

// routeErrorReports: a failed route redial is logged on the first attempt and
// then every this many (about a minute at nats-server's 1 s redial delay).
const routeErrorReports = 60

// Config is one embedded node. Every field maps to a cluster-mode setting (see
// the package doc).
type Config struct {
	// NodeName is the server name, unique in the cluster; JetStream places
	// replicas and elects leaders by it, so it must stay the same across restarts.
	NodeName string
	// ClientListen is host:port for NATS clients (port 0 picks a free port).
	ClientListen string
	// ClusterListen is host:port for routes from the other servers (port 0
	// picks a free port).
	ClusterListen string
	// Routes are nats-route://host:port URLs of the other servers. Listing
	// itself is harmless (the server detects it), so every node can get the same
	// list; at least one is required, as nats-server refuses a clustered JetStream
	// without configured routes. Routes gossip the rest of the mesh.
	Routes []string
	// StoreDir holds JetStream's files (the server adds a "jetstream" directory).
	StoreDir string
	// Replicas is how many servers hold every stream and bucket cluster mode
	// creates. The number of servers is not knowable at start, so only >= 1
	// is checked here; JetStream refuses a stream with more replicas than servers.
	Replicas int
}

// Node is a running embedded server.
type Node struct {
	srv      *server.Server
	replicas int
}

// hostPort parses a listen address, mapping port 0 to nats-server's "random
// port" (0 there means the default port, 4222 or 6222).
func hostPort(what, addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("natsembed: %s %q: %w", what, addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("natsembed: %s %q: port must be 0 to 65535", what, addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// parseRoute checks one route URL. Credentials are refused: route
// authentication is not configured here, and a password in a URL would reach
// the server's log lines.
func parseRoute(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("natsembed: route %q: %w", s, err)
	}
	if u.Scheme != "nats-route" && u.Scheme != "nats" {
		return nil, fmt.Errorf("natsembed: route %q: scheme must be nats-route://", s)
	}
	if u.User != nil {
		return nil, errors.New("natsembed: route URLs must not carry credentials")
	}
	if _, p, err := net.SplitHostPort(u.Host); err != nil || p == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("natsembed: route %q: want nats-route://host:port", s)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("natsembed: route %q: want nats-route://host:port", s)
	}
	return u, nil
}

// options validates cfg and builds the server options.
func options(cfg Config) (*server.Options, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("natsembed: node name is empty")
	}
	if strings.ContainsFunc(cfg.NodeName, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, fmt.Errorf("natsembed: node name %q has spaces or control characters", cfg.NodeName)
	}
	if cfg.StoreDir == "" {
		return nil, errors.New("natsembed: store dir is empty")
	}
	if cfg.Replicas < 1 {
		return nil, fmt.Errorf("natsembed: replicas %d: must be at least 1", cfg.Replicas)
	}
	host, port, err := hostPort("client listen", cfg.ClientListen)
	if err != nil {
		return nil, err
	}
	chost, cport, err := hostPort("cluster listen", cfg.ClusterListen)
	if err != nil {
		return nil, err
	}
	if len(cfg.Routes) == 0 {
		// nats-server refuses a clustered JetStream without configured routes.
		return nil, errors.New("natsembed: no routes: list the other servers (listing this one too is fine)")
	}
	routes := make([]*url.URL, 0, len(cfg.Routes))
	for _, r := range cfg.Routes {
		u, err := parseRoute(r)
		if err != nil {
			return nil, err
		}
		routes = append(routes, u)
	}
	return &server.Options{
		ServerName:   cfg.NodeName,
		Host:         host,
		Port:         port,
		Cluster:      server.ClusterOpts{Name: ClusterName, Host: chost, Port: cport},
		Routes:       routes,
		JetStream:    true,
		StoreDir:     cfg.StoreDir,
		SyncInterval: syncIntervalAlways,
		SyncAlways:   true,
		NoSigs:       true, // the edgerelay process owns its signals
		// Routes redial a lost peer every second; nats-server's default reports
		// every failed redial (a warning a second per down peer). Report the
		// first and then one a minute.
		ReconnectErrorReports: routeErrorReports,
	}, nil
}

// Start validates cfg (a nil log means slog.Default()), starts the server and waits until it accepts
// connections and its route listener is up, or ctx ends. It does not wait for
// the JetStream cluster to have a leader: that needs a quorum of servers, and
// nodes start one by one.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Node, error) {
	if log == nil {
		log = slog.Default()
	}
	opts, err := options(cfg)
	if err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("natsembed: node %s not started: %w", cfg.NodeName, err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsembed: node %s: %w", cfg.NodeName, err)
	}
	lg := &logger{log: log.With("nats_node", cfg.NodeName), fatal: make(chan string, 1)}
	srv.SetLoggerV2(lg, log.Enabled(ctx, slog.LevelDebug), false, false)
	go srv.Start()
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		var cause error
		select {
		case msg := <-lg.fatal:
			cause = errors.New(msg)
		case <-ctx.Done():
			cause = context.Cause(ctx)
		default:
			continue
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsembed: node %s not ready: %w", cfg.NodeName, cause)
	}
	return &Node{srv: srv, replicas: cfg.Replicas}, nil
}

// Connect opens an in-process client connection to this node's server.
func (n *Node) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(n.srv), nats.Name("edgerelay " + n.srv.Name())}, opts...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("natsembed: connect to node %s: %w", n.srv.Name(), err)
	}
	return nc, nil
}

// Name is the node's server name.
func (n *Node) Name() string { return n.srv.Name() }

// Replicas is the configured replica count for streams and buckets.
func (n *Node) Replicas() int { return n.replicas }

// ClientAddr is the bound client address (useful with port 0).
func (n *Node) ClientAddr() string { return n.srv.Addr().String() }

// ClusterAddr is the bound route address (useful with port 0).
func (n *Node) ClusterAddr() string { return n.srv.ClusterAddr().String() }

// Close shuts the server down and waits until it has. A graceful shutdown
// hands the Raft leaderships this server holds to another server first.
func (n *Node) Close() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}

// logger routes nats-server's log lines into slog. Notices, debug and trace
// lines go to debug (trace stays off: it would log message payloads), warnings
// and errors to warn. A fatal line also reaches Start, which fails with it;
// nats-server's own logger would exit the process.
type logger struct {
	log   *slog.Logger
	fatal chan string
}

func (l *logger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *logger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *logger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *logger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *logger) Errorf(format string, v ...any)  { l.log.Warn(fmt.Sprintf(format, v...)) }

func (l *logger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
