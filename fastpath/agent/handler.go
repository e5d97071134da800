package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/cors"
	"edgerelay/fastpath/ndjson"
	"edgerelay/fastpath/server"
	"edgerelay/fastpath/ws"
	"edgerelay/route"
	"edgerelay/store"
)

// Defaults of Config.
const (
	DefaultHeartbeatEvery   = 30 * time.Second
	DefaultHeartbeatTimeout = 10 * time.Second
	DefaultHelloTimeout     = 10 * time.Second
	DefaultMaxAttachments   = 64
	DefaultClientQueue      = maxClientFrame
	DefaultInstanceQueue    = 64 << 20
	DefaultLinkQueue        = 2 * ndjson.MaxLine
	DefaultClientPing       = 30 * time.Second
	DefaultWriteTimeout     = 20 * time.Second
	DefaultCloseTimeout     = 5 * time.Second
	DefaultRelayName        = "edgerelay"
)

// Config wires a Handler. Zero values take the defaults above.
type Config struct {
	// Store holds accounts, pairing keys and instances. Required.
	Store store.AgentRecords
	// Key signs every welcome (LoadOrCreateKey). Required.
	Key ed25519.PrivateKey
	// RelayName is the welcome's relay field.
	RelayName string
	Log       *slog.Logger
	// Metrics may be nil (unregistered series).
	Metrics *Metrics
	// Route carries lines between a link and clients on different nodes
	// of a cluster; route.AgentLocal (the default) on a single node.
	Route route.Agent

	// HeartbeatEvery is how long a link may stay silent before the relay
	// probes it with relay.heartbeat; HeartbeatTimeout is how long the
	// probe may go without its relay.ack before the link is closed.
	HeartbeatEvery, HeartbeatTimeout time.Duration
	// HelloTimeout bounds the wait for the hello after the 101.
	HelloTimeout time.Duration
	// MaxAttachments is how many clients one instance may have attached;
	// one more is refused with 429. The runtime's own limit is 64.
	MaxAttachments int
	// ClientQueue is how much an attachment's send queue may hold and
	// still take the next frame of any size: the queue is ClientQueue
	// plus the largest frame (maxClientFrame) big, and a frame that does
	// not fit closes the client with 1013. The default is one frame of
	// the largest size, so that a client that reads gets frames of the
	// largest size back to back (one is still being written when the next
	// comes).
	ClientQueue int
	// InstanceQueue bounds the bytes queued for all attachments of one
	// instance together. A frame that would take them past it closes the
	// attachment holding the most with 1013 (and tells the instance with
	// acp.detach), as often as it takes for the frame to fit. Never less
	// than one attachment's whole queue.
	InstanceQueue int
	// LinkQueue bounds each instance link's send queue in bytes; never
	// less than one line of the largest size (16 MiB). A client frame
	// that does not fit waits for room.
	LinkQueue int
	// MaxClientMessage is the largest WebSocket message a client may send
	// (1009 past it). Default: what fits one line once spliced.
	MaxClientMessage int
	// ClientPing is how often clients are pinged; one that has not
	// answered by the next ping is dropped.
	ClientPing time.Duration
	// WriteTimeout bounds one write to an instance link: a runtime that
	// stops reading for this long is dropped.
	WriteTimeout time.Duration
	// CloseTimeout bounds how long a closing link may take to flush.
	CloseTimeout time.Duration
	// Now is the clock for pairing expiry (time.Now by default).
	Now func() time.Time
	// CORS lets pages on other origins redeem a pairing key
	// (cors.New(RELAY_CORS_ORIGINS, CORSRules())); nil is off.
	CORS *cors.Policy
}

// maxClientFrame is the most a frame from the instance takes in a client's
// send queue: the longest line without its line feed, behind the longest
// WebSocket frame header.
const maxClientFrame = ndjson.MaxLine - 1 + 10

// spliceRoom is what a splice may add to a client message: the instance
// and session members with their values fully escaped.
const spliceRoom = 64 + 6*2*ndjson.MaxIDLen

// Handler serves the agent relay's endpoints: /v1/connect (instance
// links), /v1/attach/<instance id> (clients) and /v1/pair/redeem.
type Handler struct {
	cfg       Config
	log       *slog.Logger
	m         *Metrics
	pubString string
	// epoch anchors the monotonic clock of heartbeats (mono).
	epoch   time.Time
	clients ws.Group
	// clientWS is the client sockets' settings, shared by all of them.
	clientWS *ws.Settings
	// nowait is closed from the start: a Put with it as cancel queues
	// within the bound or not at all, without waiting.
	nowait chan struct{}

	// mu guards the maps below. It is held only to look up, add or remove,
	// never across I/O.
	mu        sync.Mutex
	instances map[string]*instance // instances with a link or attachment, by id
	links     map[*link]struct{}   // every link from hijack to end, for Drain
	draining  bool
}

// instance is one instance id with a link or attachments (or either being
// set up). It exists while something holds a reference (acquire).
type instance struct {
	id   []byte // the instance id, for splicing and frames
	name string // the same, for maps and logs
	refs int    // guarded by Handler.mu

	mu       sync.Mutex
	link     *link // the link past its welcome; nil while offline
	newest   uint64
	atts     map[string]*attachment
	reserved int // attach upgrades admitted but not yet registered
	revoked  bool

	// Lock-free views for the routing goroutines. cur is link; routes is
	// a copy of atts, replaced (never modified) on every attach and detach,
	// so a lookup per frame takes no lock.
	cur    atomic.Pointer[link]
	routes atomic.Pointer[map[string]*attachment]

	// queued is at least what the instance's frames hold in its
	// attachments' queues (the sum of their charged): frames routed add to
	// it, and only makeRoom, which asks the queues, brings it down, so
	// that the routing path checks InstanceQueue with two atomic adds.
	queued atomic.Int64
	// making serializes makeRoom: the lines of a link on another node
	// arrive on one goroutine per client (a NATS subscription each), and
	// two overflows judged at once would both pick the same slowest client
	// (counted twice), or the next one on a total that the first close
	// was about to bring down.
	making sync.Mutex
}

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("agent: Config.Store is required")
	}
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("agent: Config.Key is not an Ed25519 private key")
	}
	if cfg.RelayName == "" {
		cfg.RelayName = DefaultRelayName
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Route == nil {
		cfg.Route = route.AgentLocal{}
	}
	setDefault(&cfg.HeartbeatEvery, DefaultHeartbeatEvery)
	setDefault(&cfg.HeartbeatTimeout, DefaultHeartbeatTimeout)
	setDefault(&cfg.HelloTimeout, DefaultHelloTimeout)
	setDefault(&cfg.MaxAttachments, DefaultMaxAttachments)
	setDefault(&cfg.ClientQueue, DefaultClientQueue)
	setDefault(&cfg.InstanceQueue, DefaultInstanceQueue)
	cfg.InstanceQueue = max(cfg.InstanceQueue, cfg.ClientQueue+maxClientFrame)
	setDefault(&cfg.LinkQueue, DefaultLinkQueue)
	setDefault(&cfg.MaxClientMessage, ndjson.MaxLine-1-spliceRoom)
	setDefault(&cfg.ClientPing, DefaultClientPing)
	setDefault(&cfg.WriteTimeout, DefaultWriteTimeout)
	setDefault(&cfg.CloseTimeout, DefaultCloseTimeout)
	cfg.LinkQueue = max(cfg.LinkQueue, ndjson.MaxLine)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	nowait := make(chan struct{})
	close(nowait)
	return &Handler{
		nowait:    nowait,
		cfg:       cfg,
		log:       cfg.Log,
		m:         cfg.Metrics,
		pubString: PublicKeyString(cfg.Key.Public().(ed25519.PublicKey)),
		epoch:     time.Now(),
		instances: make(map[string]*instance),
		links:     make(map[*link]struct{}),
		clientWS: ws.NewSettings(ws.Options{
			MaxMessage:   cfg.MaxClientMessage,
			MaxQueue:     cfg.ClientQueue + maxClientFrame, // any frame fits into a queue holding ClientQueue
			OverflowCode: ws.CloseTryAgainLater,
			PingInterval: cfg.ClientPing,
		}),
	}, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// PublicKey is the relay's public key as published: 44 characters of
// padded standard base64.
func (h *Handler) PublicKey() string { return h.pubString }

// mono is a monotonic clock in nanoseconds since the Handler was made,
// never 0 (0 marks "no probe outstanding").
func (h *Handler) mono() int64 { return int64(time.Since(h.epoch)) + 1 }

var (
	pathConnect = []byte("/v1/connect")
	pathRedeem  = []byte("/v1/pair/redeem")
	pathAttach  = []byte("/v1/attach/")
)

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch {
	case bytes.Equal(path, pathConnect):
		h.connect(ctx)
	case bytes.HasPrefix(path, pathAttach):
		h.attach(ctx, path[len(pathAttach):])
	case bytes.Equal(path, pathRedeem):
		if h.cfg.CORS.Preflight(ctx) { // a preflight carries no bearer and no body
			return
		}
		h.cfg.CORS.Decorate(ctx)
		h.redeem(ctx)
	default:
		answerError(ctx, fasthttp.StatusNotFound, "not found")
	}
}

// ServeError answers the requests the listener refuses before the handler
// runs (headers or body over the limit, a client too slow, garbage) in the
// agent relay's error shape. Use it as the listener's ErrorHandler.
func (h *Handler) ServeError(ctx *fasthttp.RequestCtx, err error) {
	// A page must be able to read the refusal of a redeem too (a body
	// over the limit), or it sees only a network failure.
	h.cfg.CORS.Decorate(ctx)
	status, msg := server.Refusal(err)
	answerError(ctx, status, msg)
}

// answerError answers status with the agent relay's error shape,
// {"error":{"message":"…"}}. msg is a constant of this package and needs no
// escaping.
func answerError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	b := ctx.Response.BodyWriter()
	_, _ = b.Write([]byte(`{"error":{"message":"`))
	_, _ = b.Write([]byte(msg))
	_, _ = b.Write([]byte(`"}}`))
}

// acquire returns the instance entry for id, made if needed, with a
// reference the caller must release; nil once the Handler is draining.
func (h *Handler) acquire(id string) *instance {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return nil
	}
	in := h.instances[id]
	if in == nil {
		in = &instance{id: []byte(id), name: id, atts: make(map[string]*attachment)}
		h.instances[id] = in
	}
	in.refs++
	return in
}

// release drops a reference; the entry goes when nothing holds it, so
// memory follows what is connected, not what ever was.
func (h *Handler) release(in *instance) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if in.refs--; in.refs == 0 && h.instances[in.name] == in {
		delete(h.instances, in.name)
	}
}

func (h *Handler) lookup(id string) *instance {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.instances[id]
}

// publishRoutesLocked replaces the routing snapshot after atts changed;
// in.mu is held.
func (in *instance) publishRoutesLocked() {
	m := make(map[string]*attachment, len(in.atts))
	for k, v := range in.atts {
		m[k] = v
	}
	in.routes.Store(&m)
}

// statusTimeout bounds the route's answer to Connected and Attachments.
const statusTimeout = 5 * time.Second

// Connected reports whether instance id has a link past its welcome, on
// this node or (in a cluster) on any.
func (h *Handler) Connected(id string) bool {
	if in := h.lookup(id); in != nil && in.cur.Load() != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	online, _, known, err := h.cfg.Route.Status(ctx, id)
	return known && err == nil && online
}

// Attachments is the number of clients attached to instance id, over every
// node in a cluster.
func (h *Handler) Attachments(id string) int {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	if _, n, known, err := h.cfg.Route.Status(ctx, id); known && err == nil {
		return n
	}
	in := h.lookup(id)
	if in == nil {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.atts)
}

// Revoked closes the link and the clients of instance id, as a revocation
// through this node does (Keys.RevokeInstance): for one made through
// another node of a cluster (the cluster backend's watch calls it). Nothing
// happens when this node holds neither.
func (h *Handler) Revoked(id string) { h.disconnect(id) }

// disconnect ends everything of a revoked instance: its link is closed and
// its clients with 1008. New links and attachments are refused by the
// store from then on; one past its check but not yet registered sees
// revoked and gives up.
func (h *Handler) disconnect(id string) {
	in := h.lookup(id)
	if in == nil {
		return
	}
	in.mu.Lock()
	in.revoked = true
	l := in.link
	atts := make([]*attachment, 0, len(in.atts))
	for _, a := range in.atts {
		atts = append(atts, a)
	}
	in.mu.Unlock()
	if l != nil {
		l.close(endRevoked)
	}
	for _, a := range atts {
		a.conn.Close(ws.ClosePolicyViolation, "instance revoked")
	}
}

// Drain closes every link (after flushing what is queued for it) and every
// client with 1001, and waits for them, or for ctx to end. New links and
// attachments are refused from the start.
func (h *Handler) Drain(ctx context.Context) error {
	h.mu.Lock()
	h.draining = true
	links := make([]*link, 0, len(h.links))
	for l := range h.links {
		links = append(links, l)
	}
	h.mu.Unlock()
	for _, l := range links {
		l.close(endDrain)
	}
	err := h.clients.Drain(ctx, ws.CloseGoingAway)
	for _, l := range links {
		select {
		case <-l.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// newID returns prefix followed by 24 random hex digits: instance and
// attachment ids, unique and printable, never secret.
func newID(prefix string) string {
	var raw [12]byte
	_, _ = rand.Read(raw[:]) // never fails since Go 1.24
	return prefix + hex.EncodeToString(raw[:])
}

// newSecret returns a fresh secret (client token, pairing key, instance
// token): 64 lowercase hex digits, 256 bits.
func newSecret() string {
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	return hex.EncodeToString(raw[:])
}
