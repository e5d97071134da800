// Package channelroute routes the private channel across the nodes of a
// cluster (CLUSTER.md §4.2): a computer's control socket on node A, its
// phones on any node.
//
//   - The control socket holds the lease er_chan/host.<h> (exclusive: a
//     second control socket on any node is refused while the holder's
//     node runs) and, while it holds it, A subscribes er.ch.<h>.up (phone
//     frames and phone open/close) and serves er.ch.<h>.open (admission).
//     <h> is the hex of the claim key's hash: no subject carries client
//     bytes.
//   - A phone on B asks er.ch.<h>.open; A alone counts that computer's
//     phones, so the 32-phone limit is exact. No responders: the
//     computer is offline (403), unless the lease names a live holder,
//     whose subscription has not reached B's server yet: B asks again
//     for a moment.
//   - Phone to computer: B wraps the frame as the single node does and
//     publishes it to .up; A writes the bytes to the control socket as
//     they are. Computer to phone: A publishes the raw frame to
//     er.ch.<h>.p.<id>, which only B subscribes. Control messages (open,
//     close) carry the header Er-Ctl, so nobody parses a frame to find
//     them. One NATS connection per node keeps each socket's frames in
//     order.
//   - Node death (the peers' beats, within 2 s): B closes with 1001 every
//     phone whose computer was on A; A tells the computer "close" for
//     every phone it admitted from B.
//   - Same node: a phone whose computer is on its own node is routed by
//     the embedded route.LocalChannel and never touches NATS.
//
// Fencing: when this node learns the others may have judged it gone while
// it ran on (cluster.OnFenced), they closed its computers' phones and
// dropped their phones here. Every control socket and every phone of
// another node's computer held here closes as on a drain (1001); the
// handler's End paths then release the leases and tell the computers, and
// the clients reconnect into a cluster that agrees.
//
// The NATS callbacks never block on a socket: they queue onto the
// socket's bounded send queue (ws.Conn.WriteText), which drops that
// socket alone on overflow, as on one node.
package channelroute

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/fastpath/channel/control"
	"edgerelay/route"
	"edgerelay/store"
	"edgerelay/store/cluster"
)

const (
	// LeaseBucket holds one lease per computer with a control socket.
	LeaseBucket = "er_chan"
	// hdrCtl names a control message; its payload is the channel id
	// (upward) or empty (downward, with hdrCode).
	hdrCtl  = "Er-Ctl"
	hdrCode = "Er-Code"
	ctlOpen = "open"
	// ctlClose upward: the phone ended (or gave its admission back);
	// downward: close the phone with Er-Code.
	ctlClose = "close"
	// admitRetry is how long a phone asks again while the lease names a
	// live holder but NATS answers "no responders": the holder's
	// subscription is on its way to this node's server.
	admitRetry = time.Second
	opTimeout  = 5 * time.Second
	// probe asks a lease holder's node whether it serves the computer.
	probe = "probe"
)

// peer is one node incarnation.
type peer struct{ node, inc string }

// Router is the cluster's route.Channel for one node.
type Router struct {
	c      *cluster.Cluster
	nc     *nats.Conn
	local  *route.LocalChannel
	leases *cluster.Leases
	log    *slog.Logger
	me     peer
	// admitTTL: see Config.
	admitTTL time.Duration

	stop      chan struct{}
	swept     chan struct{}
	closeOnce sync.Once

	scratch sync.Pool

	// mu guards the two tables of the sockets whose other end is on
	// another node, kept for that node's death, and the computers served
	// here, kept for a fence.
	mu     sync.Mutex
	hosted map[peer]map[*hostedPhone]struct{} // phones of our computers, by the phone's node
	away   map[peer]map[*awayPhone]struct{}   // our phones, by their computer's node
	hosts  map[*host]struct{}                 // our computers, from their lease to their End
}

var _ route.Channel = (*Router)(nil)

// Config tunes a Router; the zero value is the production one.
type Config struct {
	// Log may be nil.
	Log *slog.Logger
	// AdmitTTL is how long a phone admitted from another node has to
	// attach before its place is given back (30 s by default; its node
	// attaches it within milliseconds, so only a lost message runs out).
	AdmitTTL time.Duration
}

// New opens the lease bucket and watches the peers.
func New(ctx context.Context, c *cluster.Cluster, cfg Config) (*Router, error) {
	l, err := c.Leases(ctx, LeaseBucket)
	if err != nil {
		return nil, fmt.Errorf("channel route: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.AdmitTTL == 0 {
		cfg.AdmitTTL = 30 * time.Second
	}
	r := &Router{
		c: c, nc: c.Conn(), local: route.NewLocalChannel(), leases: l, log: cfg.Log, admitTTL: cfg.AdmitTTL,
		me:     peer{c.Node(), c.Incarnation()},
		hosted: make(map[peer]map[*hostedPhone]struct{}),
		away:   make(map[peer]map[*awayPhone]struct{}),
		hosts:  make(map[*host]struct{}),
	}
	r.scratch.New = func() any { b := make([]byte, 0, 2048); return &b }
	c.OnPeerGone(r.peerGone)
	c.OnFenced(r.fenced)
	r.stop = make(chan struct{})
	r.swept = make(chan struct{})
	go r.sweep()
	return r, nil
}

// sweepEvery is how often the nodes this router's sockets depend on are
// checked against PeerAlive.
const sweepEvery = 250 * time.Millisecond

// sweep catches what OnPeerGone does not report: a node never heard (its
// beats had not arrived when it died) is never "gone", only no longer
// alive once this node has run for the peers' grace time. Without it,
// that node's phones here would stay open with nobody to close them.
func (r *Router) sweep() {
	defer close(r.swept)
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		var dead []peer
		for p := range r.hosted {
			if !r.c.PeerAlive(p.node, p.inc) {
				dead = append(dead, p)
			}
		}
		for p := range r.away {
			if !r.c.PeerAlive(p.node, p.inc) && !slices.Contains(dead, p) {
				dead = append(dead, p)
			}
		}
		r.mu.Unlock()
		for _, p := range dead {
			r.peerGone(p.node, p.inc)
		}
	}
}

// Close stops the sweep (the sockets end with the handler's drain).
func (r *Router) Close() error {
	r.closeOnce.Do(func() { close(r.stop) })
	<-r.swept
	return nil
}

func hostHex(key store.Hash) string { return hex.EncodeToString(key[:]) }
func upSubject(h string) string     { return "er.ch." + h + ".up" }
func openSubject(h string) string   { return "er.ch." + h + ".open" }
func phoneSubject(h string, id *control.ID) string {
	return "er.ch." + h + ".p." + string(id[:])
}

// validID: a channel id from another node names a subject token, so it
// must be what the relay mints (32 lowercase hex).
func validID(b []byte) (control.ID, bool) {
	var id control.ID
	if len(b) != control.IDLen {
		return id, false
	}
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return id, false
		}
	}
	copy(id[:], b)
	return id, true
}

func ctlMsg(subject, ctl string, code int, payload []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(hdrCtl, ctl)
	if code != 0 {
		m.Header.Set(hdrCode, strconv.Itoa(code))
	}
	m.Data = payload
	return m
}

// Connected implements route.Channel: the lease names a live holder (or
// the control socket is here).
func (r *Router) Connected(ctx context.Context, key store.Hash) (bool, error) {
	if r.local.Hosts(key) {
		return r.local.Connected(ctx, key)
	}
	_, ok, err := r.leases.Holder(ctx, "host."+hostHex(key))
	return ok, err
}

// Shutdown implements route.Channel (a release reaches every node, each
// closes its own).
func (r *Router) Shutdown(key store.Hash, code int) { r.local.Shutdown(key, code) }

// host is a computer whose control socket is on this node.
type host struct {
	r     *Router
	lh    route.ChannelHost
	key   store.Hash
	hex   string
	lease cluster.Holder
	subs  []*nats.Subscription

	mu     sync.Mutex
	ctl    route.ChannelSink
	phones map[control.ID]*hostedPhone // admitted from other nodes
	ended  bool
}

// hostedPhone is a phone on another node admitted to a computer here.
type hostedPhone struct {
	h    *host
	id   control.ID
	from peer
	lp   *route.LocalChannelPhone
}

// Host implements route.Channel.
func (r *Router) Host(ctx context.Context, key store.Hash) (route.ChannelHost, error) {
	lh, err := r.local.Host(ctx, key)
	if err != nil {
		return nil, err
	}
	h := &host{r: r, lh: lh, key: key, hex: hostHex(key), phones: make(map[control.ID]*hostedPhone)}
	lk := "host." + h.hex
	me, prev, err := r.leases.Hold(ctx, lk, true)
	if errors.Is(err, cluster.ErrHeld) && r.stale(ctx, h.hex, prev) {
		// The holder's node runs but serves no control socket of this
		// computer (its release failed): a stale hold must not lock the
		// computer out of the cluster until that node restarts.
		me, _, err = r.leases.Hold(ctx, lk, false)
	}
	if err != nil {
		lh.End()
		if errors.Is(err, cluster.ErrHeld) {
			return nil, route.ErrChannelHeld
		}
		return nil, err
	}
	h.lease = me
	r.mu.Lock()
	r.hosts[h] = struct{}{}
	r.mu.Unlock()
	// .up first: a phone admitted through .open publishes to .up next,
	// and interest in .up reaches its server before the answer does.
	for _, s := range []struct {
		subj string
		fn   nats.MsgHandler
	}{{upSubject(h.hex), h.onUp}, {openSubject(h.hex), h.onOpen}} {
		sub, err := r.nc.Subscribe(s.subj, s.fn)
		if err != nil {
			h.End()
			return nil, cluster.Fail("subscribe "+s.subj, err)
		}
		h.subs = append(h.subs, sub)
	}
	return h, nil
}

// stale reports whether the live holder of a computer's lease serves no
// control socket for it: this node, which has none (Host found none
// here), or another whose .open subject has no responder for admitRetry
// (a holder between its lease and its subscription is answered within
// that time). An error counts as not stale: refusing is the safe side.
func (r *Router) stale(ctx context.Context, hh string, holder cluster.Holder) bool {
	if holder.Node == r.me.node {
		return holder.Incarnation == r.me.inc
	}
	deadline := time.Now().Add(admitRetry)
	for {
		pctx, cancel := context.WithTimeout(ctx, opTimeout)
		_, err := r.nc.RequestWithContext(pctx, openSubject(hh), []byte(probe))
		cancel()
		switch {
		case err == nil:
			return false
		case !errors.Is(err, nats.ErrNoResponders):
			return false
		case time.Now().After(deadline):
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (h *host) Attach(ctl route.ChannelSink) bool {
	h.mu.Lock()
	h.ctl = ctl
	h.mu.Unlock()
	return h.lh.Attach(ctl)
}

func (h *host) ToPhone(id *control.ID, data []byte) bool { return h.lh.ToPhone(id, data) }
func (h *host) ClosePhone(id *control.ID) bool           { return h.lh.ClosePhone(id) }

// End closes every phone (those on other nodes through their subjects),
// stops serving the computer's subjects and gives the lease back.
func (h *host) End() {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended = true
	subs := h.subs
	phones := h.phones
	h.phones = make(map[control.ID]*hostedPhone)
	h.mu.Unlock()
	h.r.mu.Lock() // not under h.mu: fenced takes r.mu, then h.mu
	delete(h.r.hosts, h)
	h.r.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	h.lh.End()
	for _, hp := range phones {
		h.r.forgetHosted(hp)
		hp.lp.End()
	}
	if h.lease.Node != "" {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := h.r.leases.Release(ctx, "host."+h.hex, h.lease); err != nil {
			h.r.log.Warn("channel: control socket lease not released", "err", err)
		}
	}
}

// onOpen answers a phone's admission: "<node> <incarnation> <id>" ->
// "ok <node> <incarnation>" (the computer's node), "full" or "offline".
func (h *host) onOpen(m *nats.Msg) {
	if string(m.Data) == probe {
		_ = m.Respond([]byte("held"))
		return
	}
	f := strings.Fields(string(m.Data))
	if len(f) != 3 {
		return
	}
	id, ok := validID([]byte(f[2]))
	if !ok {
		return
	}
	from := peer{f[0], f[1]}
	lp, err := h.r.local.Admit(h.key, id)
	switch {
	case errors.Is(err, route.ErrChannelFull):
		_ = m.Respond([]byte("full"))
		return
	case err != nil:
		_ = m.Respond([]byte("offline"))
		return
	}
	hp := &hostedPhone{h: h, id: id, from: from, lp: lp}
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		lp.End()
		_ = m.Respond([]byte("offline"))
		return
	}
	h.phones[id] = hp
	h.mu.Unlock()
	h.r.addHosted(hp)
	if !h.r.c.PeerAlive(from.node, from.inc) {
		h.dropHosted(hp) // its node went while we admitted it
		return
	}
	// The answer waits until the control socket is attached (its 101 is
	// on its way), off the NATS goroutine; then the phone's open finds it.
	go func() {
		select {
		case <-lp.Ready():
		case <-time.After(opTimeout):
		}
		_ = m.Respond([]byte("ok " + h.r.me.node + " " + h.r.me.inc))
		// A phone whose open never comes (its answer or its abandon
		// lost) must not keep its place.
		time.AfterFunc(h.r.admitTTL, func() {
			if !lp.Attached() {
				h.dropHosted(hp)
			}
		})
	}()
}

// onUp takes what phones on other nodes send: data messages, wrapped
// there, go to the control socket as they are.
func (h *host) onUp(m *nats.Msg) {
	ctl := m.Header.Get(hdrCtl)
	if ctl == "" {
		h.mu.Lock()
		sink := h.ctl
		h.mu.Unlock()
		if sink != nil {
			_ = sink.WriteText(m.Data)
		}
		return
	}
	id, ok := validID(m.Data)
	if !ok {
		return
	}
	h.mu.Lock()
	hp := h.phones[id]
	h.mu.Unlock()
	switch ctl {
	case ctlOpen:
		// The phone's node waits for the answer: a phone whose computer
		// went between admission and open closes with 1001 there.
		if hp == nil {
			_ = m.Respond([]byte("gone"))
			return
		}
		sink := &remotePhone{nc: h.r.nc, subject: phoneSubject(h.hex, &id)}
		// Admission waited for Ready, so Attach does not wait here.
		if !hp.lp.Attach(context.Background(), sink) {
			h.dropHosted(hp)
			_ = m.Respond([]byte("gone"))
			return
		}
		_ = m.Respond([]byte("ok"))
	case ctlClose:
		if hp != nil {
			h.dropHosted(hp)
		}
	}
}

// dropHosted ends a phone of another node: the computer is told "close"
// unless it closed the channel itself.
func (h *host) dropHosted(hp *hostedPhone) {
	h.mu.Lock()
	if h.phones[hp.id] == hp {
		delete(h.phones, hp.id)
	}
	h.mu.Unlock()
	h.r.forgetHosted(hp)
	hp.lp.End()
}

// remotePhone is, on the computer's node, a phone on another node: the
// sink the local router writes its frames and its close to.
type remotePhone struct {
	nc      *nats.Conn
	subject string
}

func (p *remotePhone) WriteText(b []byte) error { return p.nc.Publish(p.subject, b) }
func (p *remotePhone) Close(code int, _ string) {
	_ = p.nc.PublishMsg(ctlMsg(p.subject, ctlClose, code, nil))
}

func (r *Router) addHosted(hp *hostedPhone) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.hosted[hp.from]
	if set == nil {
		set = make(map[*hostedPhone]struct{})
		r.hosted[hp.from] = set
	}
	set[hp] = struct{}{}
}

func (r *Router) forgetHosted(hp *hostedPhone) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if set := r.hosted[hp.from]; set != nil {
		delete(set, hp)
		if len(set) == 0 {
			delete(r.hosted, hp.from)
		}
	}
}

// awayPhone is a phone on this node whose computer is on another.
type awayPhone struct {
	r       *Router
	id      control.ID
	up      string
	subject string
	holder  peer

	mu       sync.Mutex
	sub      *nats.Subscription
	conn     route.ChannelSink
	ended    bool
	attached bool
}

// Phone implements route.Channel.
func (r *Router) Phone(ctx context.Context, key store.Hash, id control.ID) (route.ChannelPhone, error) {
	lp, err := r.local.Admit(key, id)
	if err == nil {
		return lp, nil // the computer is here: no NATS
	}
	if !errors.Is(err, route.ErrChannelOffline) || r.local.Hosts(key) {
		return nil, err
	}
	h := hostHex(key)
	req := []byte(r.me.node + " " + r.me.inc + " " + string(id[:]))
	deadline := time.Now().Add(admitRetry)
	for {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		m, err := r.nc.RequestWithContext(actx, openSubject(h), req)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) {
			_, held, lerr := r.leases.Holder(ctx, "host."+h)
			if lerr != nil {
				return nil, lerr
			}
			if !held || time.Now().After(deadline) {
				return nil, route.ErrChannelOffline
			}
			select {
			case <-ctx.Done():
				return nil, cluster.Fail("channel admission", ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			// The computer's node may have admitted it and its answer be
			// lost: give the place back, or 32 such losses would lock the
			// computer's phones out.
			_ = r.nc.PublishMsg(ctlMsg(upSubject(h), ctlClose, 0, id[:]))
			return nil, cluster.Fail("channel admission", err)
		}
		f := strings.Fields(string(m.Data))
		switch {
		case len(f) == 1 && f[0] == "full":
			return nil, route.ErrChannelFull
		case len(f) == 3 && f[0] == "ok":
			return &awayPhone{r: r, id: id, up: upSubject(h), subject: phoneSubject(h, &id), holder: peer{f[1], f[2]}}, nil
		default:
			return nil, route.ErrChannelOffline
		}
	}
}

// Attach subscribes the phone's subject, then tells the computer "open"
// (the subscription reaches the computer's server before the open does).
func (p *awayPhone) Attach(ctx context.Context, conn route.ChannelSink) bool {
	p.mu.Lock()
	if p.ended || p.attached {
		p.mu.Unlock()
		return false
	}
	sub, err := p.r.nc.Subscribe(p.subject, func(m *nats.Msg) {
		if m.Header.Get(hdrCtl) == ctlClose {
			code := 1001
			if m.Header.Get(hdrCode) == "1000" {
				code = 1000
			}
			conn.Close(code, "")
			return
		}
		_ = conn.WriteText(m.Data) // a full queue drops this phone alone
	})
	if err != nil {
		p.mu.Unlock()
		p.r.log.Warn("channel: phone subscription", "err", err)
		return false
	}
	p.sub, p.conn, p.attached = sub, conn, true
	// Not held across the request below: the peers' callback takes it.
	p.mu.Unlock()
	p.r.addAway(p)
	if !p.r.c.PeerAlive(p.holder.node, p.holder.inc) {
		return false // its computer's node went meanwhile: End cleans up
	}
	// A request, not a publish: when the computer went between the
	// admission and now, nobody would ever close this phone. The request
	// is published on the node's one connection like the frames after
	// it, so it stays ahead of them.
	m, err := p.r.nc.RequestMsgWithContext(ctx, ctlMsg(p.up, ctlOpen, 0, p.id[:]))
	return err == nil && string(m.Data) == "ok"
}

// ToHost wraps the frame as the single node does and publishes it.
func (p *awayPhone) ToHost(frame []byte) error {
	bp := p.r.scratch.Get().(*[]byte)
	*bp = control.AppendData((*bp)[:0], &p.id, frame)
	err := p.r.nc.Publish(p.up, *bp)
	if cap(*bp) <= 6*control.MaxData+4096 {
		p.r.scratch.Put(bp)
	}
	return err
}

// End tells the computer's node the channel ended (also an admission
// never attached, which it gives back).
func (p *awayPhone) End() {
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		return
	}
	p.ended = true
	sub := p.sub
	p.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	p.r.forgetAway(p)
	_ = p.r.nc.PublishMsg(ctlMsg(p.up, ctlClose, 0, p.id[:]))
}

func (r *Router) addAway(p *awayPhone) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.away[p.holder]
	if set == nil {
		set = make(map[*awayPhone]struct{})
		r.away[p.holder] = set
	}
	set[p] = struct{}{}
}

func (r *Router) forgetAway(p *awayPhone) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if set := r.away[p.holder]; set != nil {
		delete(set, p)
		if len(set) == 0 {
			delete(r.away, p.holder)
		}
	}
}

// peerGone: a node died or left. Our phones whose computer was there
// close with 1001; our computers' phones that were there end, and each
// computer is told "close" for them. Called on the beat goroutine: it
// only queues.
func (r *Router) peerGone(node, inc string) {
	gone := peer{node, inc}
	r.mu.Lock()
	hosted := r.hosted[gone]
	away := r.away[gone]
	delete(r.hosted, gone)
	delete(r.away, gone)
	r.mu.Unlock()
	if len(hosted)+len(away) > 0 {
		r.log.Info("channel: node gone", "node", node, "phones_closed", len(away), "phones_lost", len(hosted))
	}
	for hp := range hosted {
		hp.h.dropHosted(hp)
	}
	for p := range away {
		p.mu.Lock()
		conn := p.conn
		p.mu.Unlock()
		if conn != nil {
			conn.Close(1001, "computer offline")
		}
	}
}

// fenced closes the sockets this node held before the fence (see the
// package comment): every attached control socket (its phones here close
// with it, those on other nodes through their subjects) and every phone
// whose computer is on another node. Called on the beat goroutine or
// NATS's: it only queues closes.
func (r *Router) fenced() {
	var socks []route.ChannelSink
	r.mu.Lock()
	for h := range r.hosts {
		h.mu.Lock()
		if h.ctl != nil {
			socks = append(socks, h.ctl)
		}
		h.mu.Unlock()
	}
	for _, set := range r.away {
		for p := range set {
			p.mu.Lock()
			if p.conn != nil {
				socks = append(socks, p.conn)
			}
			p.mu.Unlock()
		}
	}
	r.mu.Unlock()
	if len(socks) > 0 {
		r.log.Info("channel: node fenced", "sockets_closed", len(socks))
	}
	for _, s := range socks {
		s.Close(1001, "relay going away")
	}
}
