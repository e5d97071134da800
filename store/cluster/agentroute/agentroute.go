// Package agentroute is the agent relay's route.Agent over a cluster
// (CLUSTER.md §4.3): an instance's link on node A, its clients on B.
//
// Names (bucket er_agent; subjects on core NATS). Instance ids and
// attachment ids are relay-minted; one that is not subject-safe never
// becomes a subject (the instance gets no cross-node routing, a session
// line is dropped):
//
//	link.<inst>            lease: the node holding the instance's link
//	att.<inst>             the attachments, "<session> <node> <incarnation>" a line, at most max
//	er.ag.<inst>.in        lines for the link, served by the link's node
//	er.ag.<inst>.s.<sess>  lines for one client, served by its node
//	er.ag.<inst>.ctl       "online|offline <gen> <node> <incarnation>"
//
// The design choices:
//   - The newer link wins: a hold of link.<inst> with the next generation,
//     announced as online on .ctl; a hold of a lower generation that hears
//     it is replaced. Every node with a client of the instance follows .ctl
//     (and reads the lease when it first needs the instance), so it answers
//     unknown_instance itself while no live node holds the link: after an
//     offline, or as soon as the peers say the holder's node is gone.
//   - A link given back keeps its generation in the lease (Leases.Release),
//     so that the next link anywhere is newer; after a NATS reconnect
//     every lease followed is read again.
//   - The attachment limit is exact over the cluster, offline too: slots
//     are taken and given back by compare-and-set of att.<inst>. Entries of
//     a node that is gone are pruned by whoever changes the set next. One
//     change from a node at a time, and each carries out that node's slots
//     being given back, so a node's attaches and leaves never contend and
//     an attach here is never refused beside a leave here (as on one node);
//     other nodes' writers are waited out with short random pauses for as
//     long as the attach's bound lasts (attachTimeout), never a count of
//     rounds. A slot taken is given back until it is out of the set.
//   - The link's node knows its clients on other nodes (att.<inst> read
//     when the link is held, then the Er-Attach and Er-Left notices on
//     .in) and detaches those of a node that is gone as soon as the peers
//     say so, without the store: with embedded servers the dead node may
//     have led the bucket, whose election takes seconds. A node that
//     prunes an entry the link's node may not have learnt tells it
//     (Er-Detach); each client is detached once.
//   - Fencing: when this node learns the others may have judged it gone
//     while it ran on (Cluster.OnFenced), it closes every link and client
//     it holds as a drain does (links flushed and closed, clients 1001):
//     the others told their ends this node died, so these reconnect into
//     a consistent cluster, and their end paths give back leases and
//     slots as always (AgentLink.Fenced, AgentClient.Fenced).
//   - Nothing read from NATS ever waits for a socket: lines go to the
//     handler's bounded queues, which close a slow client with 1013.
//   - Flow control from a client to a link on another node: a client here
//     waits for room in a link on its own node's queue, but one elsewhere
//     cannot (the link's node reads NATS, which must not wait). So when a
//     line does not fit the link's queue (AgentLink.Offer), the client
//     closed is the one whose lines hold the most of that queue (the link
//     counts each remote sender's bytes in it): the flooder, whether the
//     line was its own or another client's colliding with it (that line is
//     queued, in a small room past the bound kept for such collisions). The
//     link's node tells the runtime acp.detach at once (from the queue's
//     reserve), drops that client's lines still in flight, and tells the
//     client's node (Er-Overflow on the session's subject), which closes it
//     with 1013 and gives its slot back. The runtime, the link and the other
//     clients flow on; the client's own acp.detach is not sent twice.
//   - Lines longer than a NATS payload (max_payload, 1 MB by default) go
//     as chunks with an Er-Chunk header "<node>/<msgid>/<i>/<n>", in order
//     on this node's one connection, and are reassembled by the receiving
//     subscription under a byte bound (maxPartial): a chunk out of order, or
//     one past the bound, drops its line. Shorter lines carry no header.
package agentroute

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/fastpath/ndjson"
	"edgerelay/route"
	"edgerelay/store/cluster"
)

// Bucket holds the link leases and the attachment sets.
const Bucket = "er_agent"

// Headers of the messages that are not a line.
const (
	hdrChunk  = "Er-Chunk"  // "<node>/<incarnation>/<msgid>/<i>/<n>"
	hdrAttach = "Er-Attach" // on .in: "<session> <node> <incarnation>" attached
	hdrLeft   = "Er-Left"   // on .in, on a client's acp.detach: "<session>"
	hdrDetach = "Er-Detach" // on .in: "<session>", whose node is gone
	// on .s.<session>: the client overflowed the link's queue
	hdrOverflow = "Er-Overflow"
)

// maxPartial bounds the bytes one subscription holds of lines still in
// chunks: two of the longest lines at once (two publishers), then lines
// are dropped.
const maxPartial = 2 * ndjson.MaxLine

// opTimeout bounds one KV operation done in the background.
const opTimeout = 5 * time.Second

// attachTimeout bounds an Attach, whatever the caller's context (the
// handler's has no deadline): long enough for the bucket's stream to
// elect a new leader, after which the client gets 503 and retries.
const attachTimeout = 10 * time.Second

// Router is the cluster's route.Agent. Close it when the node stops.
type Router struct {
	c      *cluster.Cluster
	nc     *nats.Conn
	leases *cluster.Leases
	kv     jetstream.KeyValue
	log    *slog.Logger
	chunk  int // the largest payload of one message
	msgID  atomic.Uint64

	mu    sync.Mutex
	insts map[string]*inst // instances with a hold or attachment here
}

var _ route.Agent = (*Router)(nil)

// inst is what this node knows of one instance it has a link or client of.
type inst struct {
	name string
	in   string // er.ag.<inst>.in
	ctl  string // er.ag.<inst>.ctl
	refs int    // guarded by Router.mu
	sub  *nats.Subscription

	mu     sync.Mutex
	holder cluster.Holder // the newest link heard of
	online bool           // whether holder's link is up
	holds  map[*linkHold]struct{}
	atts   map[*attachment]struct{} // this node's clients of it, for the fence
	// leaving are the sessions of this node whose slots are to be given
	// back: every change of att.<inst> from this node drops them, so an
	// attach here never waits for (or is refused beside) a leave here.
	leaving map[string]struct{}

	// writing admits one change of att.<inst> from this node at a time:
	// this node's attaches and leaves never contend with each other.
	writing chan struct{}
}

// New opens the bucket and starts following the peers.
func New(ctx context.Context, c *cluster.Cluster, log *slog.Logger) (*Router, error) {
	leases, err := c.Leases(ctx, Bucket)
	if err != nil {
		return nil, fmt.Errorf("agentroute: leases: %w", err)
	}
	kv, err := c.Bucket(ctx, cluster.BucketConfig{Name: Bucket})
	if err != nil {
		return nil, fmt.Errorf("agentroute: bucket: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Room for the headers of a chunk.
	chunk := int(c.Conn().MaxPayload()) - 1024
	if chunk < 4096 {
		return nil, fmt.Errorf("agentroute: NATS max_payload %d is too small", c.Conn().MaxPayload())
	}
	r := &Router{c: c, nc: c.Conn(), leases: leases, kv: kv, log: log, chunk: chunk, insts: make(map[string]*inst)}
	c.OnPeerGone(r.peerGone)
	c.OnFenced(r.fenced)
	go r.followReconnects(r.nc.StatusChanged(nats.CONNECTED, nats.CLOSED))
	return r, nil
}

// followReconnects reads the link leases again after every reconnect:
// what was said on .ctl meanwhile never arrived.
func (r *Router) followReconnects(ch chan nats.Status) {
	for s := range ch {
		if s == nats.CLOSED {
			r.nc.RemoveStatusListener(ch)
			return
		}
		r.refresh()
	}
}

// refresh reads the lease of every instance this node follows.
func (r *Router) refresh() {
	r.mu.Lock()
	insts := make([]*inst, 0, len(r.insts))
	for _, i := range r.insts {
		insts = append(insts, i)
	}
	r.mu.Unlock()
	for _, i := range insts {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		h, live, err := r.leases.Holder(ctx, "link."+i.name)
		cancel()
		if err != nil {
			r.log.Warn("agent: link state not read again after a reconnect", "instance", i.name, "err", err)
			continue
		}
		if live {
			i.heard(h, true)
			continue
		}
		i.mu.Lock()
		if h.Gen >= i.holder.Gen {
			i.online = false // no live node holds it, as of this read
		}
		i.mu.Unlock()
	}
}

// safeSession: a relay-minted attachment id, "att-" and 24 hex digits.
func safeSession[T string | []byte](s T) bool {
	if len(s) != 28 || string(s[:4]) != "att-" {
		return false
	}
	for i := 4; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ref returns the instance's entry, following its .ctl from the first
// reference on; unref drops it.
func (r *Router) ref(ctx context.Context, name string) (*inst, error) {
	r.mu.Lock()
	i := r.insts[name]
	if i != nil {
		i.refs++
		r.mu.Unlock()
		return i, nil
	}
	i = &inst{name: name, in: "er.ag." + name + ".in", ctl: "er.ag." + name + ".ctl", refs: 1, holds: make(map[*linkHold]struct{}), atts: make(map[*attachment]struct{}), leaving: make(map[string]struct{}), writing: make(chan struct{}, 1)}
	r.insts[name] = i
	// Subscribed under the lock, so that a second reference does not
	// use the entry before it follows .ctl.
	sub, err := r.nc.Subscribe(i.ctl, i.control)
	if err != nil {
		delete(r.insts, name)
		r.mu.Unlock()
		return nil, cluster.Fail("agent: follow "+i.ctl, err)
	}
	i.sub = sub
	r.mu.Unlock()
	// The lease after the subscription: nothing announced since is missed,
	// and an announcement newer than the read wins (heard).
	h, ok, err := r.holder(ctx, name)
	if err != nil {
		r.unref(i)
		return nil, err
	}
	if ok {
		i.heard(h, true)
	}
	return i, nil
}

// holder reads the link lease of instance name, again while ctx lasts if
// a read fails: each read is bounded by roundTimeout, so that a request
// the stream did not answer (a reply lost, a leader being elected under
// load) is asked again rather than waited on for the lease's whole bound
// (opTimeout, 5 s), which then failed the attach that needed it.
func (r *Router) holder(ctx context.Context, name string) (cluster.Holder, bool, error) {
	for try := 0; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, roundTimeout)
		h, ok, err := r.leases.Holder(rctx, "link."+name)
		cancel()
		if err == nil || !pause(ctx, try) {
			return h, ok, err
		}
	}
}

// pause waits before a retry (cluster.Backoff); false if ctx ends first.
func pause(ctx context.Context, try int) bool { return cluster.Backoff(ctx, try, maxPause) }

// maxPause bounds one wait between the tries of a store operation.
const maxPause = 64 * time.Millisecond

func (r *Router) unref(i *inst) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i.refs--; i.refs == 0 && r.insts[i.name] == i {
		delete(r.insts, i.name)
		_ = i.sub.Unsubscribe()
	}
}

// control follows er.ag.<inst>.ctl.
func (i *inst) control(m *nats.Msg) {
	f := strings.Fields(string(m.Data))
	if len(f) != 4 || (f[0] != "online" && f[0] != "offline") {
		return
	}
	gen, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return
	}
	i.heard(cluster.Holder{Node: f[2], Incarnation: f[3], Gen: gen}, f[0] == "online")
}

// heard takes news of a link: the newest generation decides; a link of
// this node older than an online one is replaced.
func (i *inst) heard(h cluster.Holder, online bool) {
	i.mu.Lock()
	if h.Gen < i.holder.Gen || (h.Gen == i.holder.Gen && online && !i.online) {
		// Older news, or an online (read from the lease) of a generation
		// whose offline was heard: offline is final.
		i.mu.Unlock()
		return
	}
	i.holder, i.online = h, online
	var replaced []*linkHold
	if online {
		for lh := range i.holds {
			if lh.me.Gen < h.Gen {
				replaced = append(replaced, lh)
			}
		}
	}
	i.mu.Unlock()
	for _, lh := range replaced {
		lh.l.Replaced()
	}
}

// remoteLink reports whether another node's live link holds the instance.
func (r *Router) remoteLink(i *inst) bool {
	i.mu.Lock()
	h, online := i.holder, i.online
	i.mu.Unlock()
	return online && !(h.Node == r.c.Node() && h.Incarnation == r.c.Incarnation())
}

// peerGone: the links of a gone node are offline for its instances' clients
// here; the clients it had of instances whose link is here are detached.
func (r *Router) peerGone(node, incarnation string) {
	r.mu.Lock()
	var held []*inst
	for _, i := range r.insts {
		i.mu.Lock()
		if i.holder.Node == node && i.holder.Incarnation == incarnation {
			i.online = false
		}
		if len(i.holds) > 0 {
			held = append(held, i)
		}
		i.mu.Unlock()
	}
	r.mu.Unlock()
	if len(held) == 0 {
		return
	}
	// The link's clients on that node are detached from what the link's
	// node knows, without waiting for the store: with an embedded
	// nats-server the node that died may have led the bucket's stream.
	for _, i := range held {
		i.mu.Lock()
		holds := make([]*linkHold, 0, len(i.holds))
		for lh := range i.holds {
			holds = append(holds, lh)
		}
		i.mu.Unlock()
		for _, lh := range holds {
			lh.nodeGone(node, incarnation)
		}
	}
	// The KV work off the peers' goroutine, which must not block.
	go func() {
		for _, i := range held {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			if err := r.changeSet(ctx, i, func(s attSet) (attSet, error) { return s, errUnchanged }); err != nil {
				r.log.Warn("agent: detaching the clients of a gone node", "instance", i.name, "err", err)
			}
			cancel()
		}
	}()
}

// fenced closes every link and client of this node (their Fenced): the
// others may have judged it gone and told their ends so. Called from the
// peers' goroutines: the closes only start the sockets' ends.
func (r *Router) fenced() {
	var ends []interface{ Fenced() }
	r.mu.Lock()
	for _, i := range r.insts {
		i.mu.Lock()
		for lh := range i.holds {
			ends = append(ends, lh.l)
		}
		for a := range i.atts {
			ends = append(ends, a.c)
		}
		i.mu.Unlock()
	}
	r.mu.Unlock()
	for _, f := range ends {
		f.Fenced()
	}
	if len(ends) > 0 {
		r.log.Warn("agent: fenced: links and clients closed to reconnect", "sockets", len(ends))
	}
}

// publish sends line to subject, in chunks if it is longer than a
// payload.
func (r *Router) publish(subject string, line []byte) error {
	if len(line) <= r.chunk {
		return r.nc.Publish(subject, line)
	}
	id := strconv.FormatUint(r.msgID.Add(1), 10)
	n := (len(line) + r.chunk - 1) / r.chunk
	prefix := r.c.Node() + "/" + r.c.Incarnation() + "/" + id + "/"
	total := "/" + strconv.Itoa(n)
	for k := range n {
		part := line[k*r.chunk : min(len(line), (k+1)*r.chunk)]
		m := &nats.Msg{Subject: subject, Data: part, Header: nats.Header{}}
		m.Header.Set(hdrChunk, prefix+strconv.Itoa(k)+total)
		if err := r.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	return nil
}

// reassembler turns one subscription's messages back into lines. A
// subscription's callback runs on one goroutine, so it needs no lock.
type reassembler struct {
	parts map[string]*partial // by "<node>/<incarnation>/<msgid>"
	held  int
}

type partial struct {
	next, n int
	buf     []byte
	last    time.Time // when its last chunk came
}

// staleAfter is how long a line in chunks may wait for its next chunk
// before a line that needs the room drops it (its publisher died halfway).
const staleAfter = 2 * time.Second

// add takes one message and returns a whole line, or nil.
func (ra *reassembler) add(m *nats.Msg) []byte {
	tag := ""
	if m.Header != nil {
		tag = m.Header.Get(hdrChunk)
	}
	if tag == "" {
		return m.Data
	}
	j := strings.LastIndexByte(tag, '/')
	k := strings.LastIndexByte(tag[:max(j, 0)], '/')
	if k <= 0 {
		return nil
	}
	key := tag[:k]
	idx, err1 := strconv.Atoi(tag[k+1 : j])
	n, err2 := strconv.Atoi(tag[j+1:])
	if err1 != nil || err2 != nil || n < 2 || idx < 0 || idx >= n {
		return nil
	}
	if ra.parts == nil {
		ra.parts = make(map[string]*partial)
	}
	p := ra.parts[key]
	if p == nil {
		if idx != 0 {
			return nil // its start was dropped
		}
		p = &partial{n: n}
		ra.parts[key] = p
	}
	now := time.Now()
	if ra.held+len(m.Data) > maxPartial {
		for k, q := range ra.parts {
			if q != p && now.Sub(q.last) > staleAfter {
				ra.drop(k, q)
			}
		}
	}
	if idx != p.next || n != p.n || len(p.buf)+len(m.Data) > ndjson.MaxLine || ra.held+len(m.Data) > maxPartial {
		ra.drop(key, p)
		return nil
	}
	p.buf = append(p.buf, m.Data...)
	p.last = now
	ra.held += len(m.Data)
	p.next++
	if p.next < p.n {
		return nil
	}
	ra.drop(key, p)
	return p.buf
}

func (ra *reassembler) drop(key string, p *partial) {
	ra.held -= len(p.buf)
	delete(ra.parts, key)
}

// Link implements route.Agent.
func (r *Router) Link(ctx context.Context, name string, l route.AgentLink) (route.AgentLinkHold, error) {
	if !cluster.SubjectToken(name) {
		return noHold{}, nil // no subject can name it: this node's clients only
	}
	i, err := r.ref(ctx, name)
	if err != nil {
		return nil, err
	}
	me, _, err := r.leases.Hold(ctx, "link."+name, false)
	if err != nil {
		r.unref(i)
		return nil, err
	}
	lh := &linkHold{r: r, i: i, l: l, me: me, subjects: make(map[string]string), clients: make(map[string]attEntry), ended: make(map[string]struct{}), overflowed: make(map[string]struct{})}
	var ra reassembler
	sub, err := r.nc.Subscribe(i.in, func(m *nats.Msg) {
		if m.Header != nil {
			if v := m.Header.Get(hdrAttach); v != "" {
				if f := strings.Fields(v); len(f) == 3 && safeSession(f[0]) {
					lh.learn(attEntry{f[0], f[1], f[2]})
				}
				return
			}
			if v := m.Header.Get(hdrDetach); v != "" {
				if safeSession(v) {
					lh.detached(v)
				}
				return
			}
			if v := m.Header.Get(hdrLeft); v != "" && !lh.forget(v) {
				return // told already (it overflowed): no second acp.detach
			}
		}
		if line := ra.add(m); line != nil {
			lh.deliver(line)
		}
	})
	if err != nil {
		_ = r.leases.Release(ctx, "link."+name, me)
		r.unref(i)
		return nil, cluster.Fail("agent: serve "+i.in, err)
	}
	lh.sub = sub
	// The clients attached so far, read after the subscription, so that
	// one attaching meanwhile is learnt from its notice or from here.
	if e, err := r.kv.Get(ctx, "att."+name); err == nil {
		for _, a := range parseSet(e.Value()) {
			if a.node != r.c.Node() || a.incarnation != r.c.Incarnation() {
				lh.learn(a)
			}
		}
	} else if !cluster.Absent(err) {
		_ = sub.Unsubscribe()
		_ = r.leases.Release(ctx, "link."+name, me)
		r.unref(i)
		return nil, cluster.Fail("agent: read att."+name, err)
	}
	i.mu.Lock()
	i.holds[lh] = struct{}{}
	i.mu.Unlock()
	// Announced after the subscription, so that a client elsewhere that
	// hears it finds the link listening; an older link anywhere hears it
	// and is replaced.
	i.heard(me, true)
	if err := r.announce(i, "online", me); err != nil {
		lh.Release()
		return nil, err
	}
	return lh, nil
}

func (r *Router) announce(i *inst, what string, h cluster.Holder) error {
	msg := what + " " + strconv.FormatUint(h.Gen, 10) + " " + h.Node + " " + h.Incarnation
	if err := r.nc.Publish(i.ctl, []byte(msg)); err != nil {
		return cluster.Fail("agent: announce "+i.ctl, err)
	}
	return nil
}

// linkHold is a link of this node holding its instance.
type linkHold struct {
	r    *Router
	i    *inst
	l    route.AgentLink
	me   cluster.Holder
	sub  *nats.Subscription
	once sync.Once

	// subjects caches the subjects of sessions lines went to (the link's
	// reading goroutine is the only caller of ToSession), so that a
	// line costs no allocation; cleared when it reaches maxSessions.
	subjects map[string]string

	// clients are the link's clients on other nodes, by session: whom
	// to detach when their node is gone. ended are the sessions the link
	// has been told of (a detach, or the client's own acp.detach), so that
	// a later prune of the same slot tells it nothing more; a session
	// neither learnt nor ended (its notice missed) is still told once.
	mu      sync.Mutex
	clients map[string]attEntry
	ended   map[string]struct{}
	// overflowed are the clients closed for overflowing the link's queue
	// whose own acp.detach (Er-Left) has not come yet; dropping is its
	// size, read without the lock per line.
	overflowed map[string]struct{}
	dropping   atomic.Int32
}

// maxEnded bounds ended; past it the oldest knowledge is dropped (a slot
// pruned that late would be told twice).
const maxEnded = 4096

// learn records a client on another node.
func (lh *linkHold) learn(a attEntry) {
	lh.mu.Lock()
	if _, done := lh.ended[a.session]; !done {
		lh.clients[a.session] = a
	}
	lh.mu.Unlock()
}

// endLocked marks session told; lh.mu is held.
func (lh *linkHold) endLocked(session string) {
	delete(lh.clients, session)
	if len(lh.ended) >= maxEnded {
		clear(lh.ended)
	}
	lh.ended[session] = struct{}{}
}

// forget drops a client that left (its acp.detach follows as a line) and
// reports whether the link is still to be told (its acp.detach is to go).
func (lh *linkHold) forget(session string) bool {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	_, overflowed := lh.overflowed[session]
	if overflowed {
		delete(lh.overflowed, session)
		lh.dropping.Store(int32(len(lh.overflowed)))
	}
	lh.endLocked(session)
	return !overflowed
}

// deliver hands a client's line to the link; one that does not fit closes
// its client (see the package comment). Called by the .in subscription's
// goroutine only.
func (lh *linkHold) deliver(line []byte) {
	// The lines of a client that overflowed, still in flight, are dropped
	// (the runtime was told it left); a scan per line only meanwhile.
	if lh.dropping.Load() > 0 {
		if sess := sessionOf(line); sess != nil && lh.isOverflowed(sess) {
			return
		}
	}
	if sess := lh.l.Offer(line); sess != nil && safeSession(sess) {
		lh.overflow(string(sess))
	}
}

// sessionOf is the session a client's line was spliced with, or nil.
func sessionOf(line []byte) []byte {
	f, err := ndjson.Scan(line)
	if err != nil || !f.Session.Present() || f.Session.Escaped {
		return nil
	}
	return f.Session.Raw(line)
}

func (lh *linkHold) isOverflowed(session []byte) bool {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	_, ok := lh.overflowed[string(session)]
	return ok
}

// overflow ends the client holding the most of the link's queue when a
// line did not fit it: the runtime is told at once, the client's node
// closes it.
func (lh *linkHold) overflow(session string) {
	lh.mu.Lock()
	_, done := lh.ended[session]
	if !done {
		lh.endLocked(session)
		if len(lh.overflowed) >= maxEnded {
			clear(lh.overflowed)
		}
		lh.overflowed[session] = struct{}{}
		lh.dropping.Store(int32(len(lh.overflowed)))
	}
	lh.mu.Unlock()
	if done {
		return
	}
	lh.r.log.Info("agent: client closed: it held the most of the link's queue on another node when a line did not fit", "instance", lh.i.name, "session", session)
	lh.l.Detached([]byte(session))
	m := &nats.Msg{Subject: "er.ag." + lh.i.name + ".s." + session, Header: nats.Header{}}
	m.Header.Set(hdrOverflow, "1")
	_ = lh.r.nc.PublishMsg(m)
}

// detached tells the link, once, that a client has gone without saying
// so.
func (lh *linkHold) detached(session string) {
	lh.mu.Lock()
	_, done := lh.ended[session]
	lh.endLocked(session)
	lh.mu.Unlock()
	if !done {
		lh.l.Detached([]byte(session))
	}
}

// nodeGone detaches the clients of a node that is gone.
func (lh *linkHold) nodeGone(node, incarnation string) {
	lh.mu.Lock()
	var gone []string
	for s, a := range lh.clients {
		if a.node == node && a.incarnation == incarnation {
			gone = append(gone, s)
			lh.endLocked(s)
		}
	}
	lh.mu.Unlock()
	for _, s := range gone {
		lh.l.Detached([]byte(s))
	}
}

const maxSessions = 256

// ToSession implements route.AgentLinkHold.
func (lh *linkHold) ToSession(session, line []byte) bool {
	subject, ok := lh.subjects[string(session)]
	if !ok {
		if !safeSession(session) {
			return false
		}
		if len(lh.subjects) >= maxSessions {
			clear(lh.subjects)
		}
		subject = "er.ag." + lh.i.name + ".s." + string(session)
		lh.subjects[string(session)] = subject
	}
	return lh.r.publish(subject, line) == nil
}

// Release implements route.AgentLinkHold.
func (lh *linkHold) Release() {
	lh.once.Do(func() {
		r, i := lh.r, lh.i
		_ = lh.sub.Unsubscribe()
		i.mu.Lock()
		delete(i.holds, lh)
		i.mu.Unlock()
		i.heard(lh.me, false)
		if err := r.announce(i, "offline", lh.me); err != nil {
			r.log.Warn("agent: link offline not announced", "instance", i.name, "err", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		if err := r.leases.Release(ctx, "link."+i.name, lh.me); err != nil {
			r.log.Warn("agent: link lease not released", "instance", i.name, "err", err)
		}
		cancel()
		r.unref(i)
	})
}

type noHold struct{}

func (noHold) ToSession(_, _ []byte) bool { return false }
func (noHold) Release()                   {}

// attEntry is one slot of att.<inst>.
type attEntry struct{ session, node, incarnation string }

type attSet []attEntry

func parseSet(b []byte) attSet {
	var s attSet
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		if f := strings.Fields(string(line)); len(f) == 3 {
			s = append(s, attEntry{f[0], f[1], f[2]})
		}
	}
	return s
}

func (s attSet) encode() []byte {
	var b []byte
	for _, e := range s {
		b = append(b, e.session+" "+e.node+" "+e.incarnation+"\n"...)
	}
	return b
}

// errUnchanged: a change that changes nothing writes nothing.
var errUnchanged = errors.New("unchanged")

// changeSet applies change to att.<inst> by compare-and-set, after
// pruning the entries of nodes that are gone and dropping this node's
// leaving sessions; for each entry it pruned, it tells the link (here, or
// through .in) that the client left.
//
// One change from this node at a time (inst.writing): the only writers
// that contend are other nodes', and a lost compare-and-set, or a round
// the store did not answer, is tried again after a short random pause
// until ctx ends (every change is idempotent: an attach finds its session
// there, a leave finds it gone). A round count would fail a change that
// fits the limit whenever others write the key quickly (a write refused
// while another is in flight in Raft comes back at once, so 32 rounds took
// a few milliseconds); the client would get a 503 that one node never gives.
func (r *Router) changeSet(ctx context.Context, i *inst, change func(attSet) (attSet, error)) error {
	select {
	case i.writing <- struct{}{}:
	case <-ctx.Done():
		return cluster.Fail("agent: write att."+i.name, ctx.Err())
	}
	defer func() { <-i.writing }()
	key := "att." + i.name
	for try := 0; ; try++ {
		err := r.changeSetOnce(ctx, i, key, change)
		if err == nil || errors.Is(err, route.ErrAgentFull) || !pause(ctx, try) {
			return err
		}
	}
}

// roundTimeout bounds one round of changeSet (and one lease read): a
// request that the stream does not answer (its leader just died) is not
// waited on for the whole of the caller's context.
const roundTimeout = 2 * time.Second

// changeSetOnce is one read and compare-and-set of changeSet; a lost
// compare-and-set comes back as itself (cluster.Conflict).
func (r *Router) changeSetOnce(ctx context.Context, i *inst, key string, change func(attSet) (attSet, error)) error {
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	i.mu.Lock()
	leaving := make([]string, 0, len(i.leaving))
	for s := range i.leaving {
		leaving = append(leaving, s)
	}
	i.mu.Unlock()
	var cur attSet
	var rev uint64
	e, err := r.kv.Get(ctx, key)
	switch {
	case cluster.Absent(err):
	case err != nil:
		return cluster.Fail("agent: read "+key, err)
	default:
		cur, rev = parseSet(e.Value()), e.Revision()
	}
	var kept, pruned attSet
	dropped := 0
	for _, a := range cur {
		switch {
		case a.node == r.c.Node() && a.incarnation == r.c.Incarnation() && slices.Contains(leaving, a.session):
			dropped++
		case r.c.PeerAlive(a.node, a.incarnation):
			kept = append(kept, a)
		default:
			pruned = append(pruned, a)
		}
	}
	next, err := change(kept)
	if err != nil && !errors.Is(err, errUnchanged) {
		return err
	}
	if errors.Is(err, errUnchanged) {
		if len(pruned) == 0 && dropped == 0 {
			i.left(leaving)
			return nil
		}
		next = kept
	}
	switch {
	case rev == 0:
		_, err = r.kv.Create(ctx, key, next.encode())
	case len(next) == 0:
		err = r.kv.Delete(ctx, key, jetstream.LastRevision(rev))
	default:
		_, err = r.kv.Update(ctx, key, next.encode(), rev)
	}
	if err == nil {
		i.left(leaving)
		for _, a := range pruned {
			r.gone(i, a.session)
		}
		return nil
	}
	if cluster.Conflict(err) {
		return err
	}
	return cluster.Fail("agent: write "+key, err)
}

// left forgets leaving sessions that att.<inst> no longer holds.
func (i *inst) left(sessions []string) {
	i.mu.Lock()
	for _, s := range sessions {
		delete(i.leaving, s)
	}
	i.mu.Unlock()
}

// gone tells the instance's link that session's client left without
// saying so (its node is gone).
func (r *Router) gone(i *inst, session string) {
	i.mu.Lock()
	var here []*linkHold
	for lh := range i.holds {
		here = append(here, lh)
	}
	i.mu.Unlock()
	for _, lh := range here {
		lh.detached(session)
	}
	if len(here) == 0 && r.remoteLink(i) {
		m := &nats.Msg{Subject: i.in, Header: nats.Header{}}
		m.Header.Set(hdrDetach, session)
		_ = r.nc.PublishMsg(m)
	}
}

// Attach implements route.Agent.
func (r *Router) Attach(ctx context.Context, name, session string, limit int, c route.AgentClient) (route.AgentAttachment, error) {
	if !cluster.SubjectToken(name) || !safeSession(session) {
		return nil, fmt.Errorf("agentroute: instance %q or session not fit for a subject", name)
	}
	ctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	i, err := r.ref(ctx, name)
	if err != nil {
		return nil, err
	}
	me := attEntry{session, r.c.Node(), r.c.Incarnation()}
	err = r.changeSet(ctx, i, func(s attSet) (attSet, error) {
		if slices.Contains(s, me) {
			return s, errUnchanged // a round whose answer was lost wrote it
		}
		if len(s) >= limit {
			return nil, route.ErrAgentFull
		}
		return append(s, me), nil
	})
	a := &attachment{r: r, i: i, c: c, session: session}
	if errors.Is(err, route.ErrAgentFull) {
		r.unref(i)
		return nil, err
	}
	if err != nil {
		// A write whose answer never came may still be applied: the slot
		// is given back as a leave's, once such a write is settled.
		go func() {
			time.Sleep(roundTimeout)
			a.free()
		}()
		return nil, err
	}
	var ra reassembler
	a.sub, err = r.nc.Subscribe("er.ag."+name+".s."+session, func(m *nats.Msg) {
		if m.Header != nil && m.Header.Get(hdrOverflow) != "" {
			c.Overflowed()
			return
		}
		if line := ra.add(m); line != nil {
			c.Deliver(line)
		}
	})
	if err != nil {
		go a.free()
		return nil, cluster.Fail("agent: subscribe session", err)
	}
	i.mu.Lock()
	i.atts[a] = struct{}{}
	i.mu.Unlock()
	// The link's node, if another, learns where this client is, to detach
	// it should this node die.
	m := &nats.Msg{Subject: i.in, Header: nats.Header{}}
	m.Header.Set(hdrAttach, session+" "+me.node+" "+me.incarnation)
	_ = r.nc.PublishMsg(m)
	return a, nil
}

// Status implements route.Agent: the lease and the attachment set, less
// what belongs to nodes that are gone.
func (r *Router) Status(ctx context.Context, name string) (online bool, attachments int, known bool, err error) {
	if !cluster.SubjectToken(name) {
		return false, 0, false, nil
	}
	_, live, err := r.leases.Holder(ctx, "link."+name)
	if err != nil {
		return false, 0, false, err
	}
	e, err := r.kv.Get(ctx, "att."+name)
	switch {
	case cluster.Absent(err):
	case err != nil:
		return false, 0, false, cluster.Fail("agent: read att."+name, err)
	default:
		for _, a := range parseSet(e.Value()) {
			if r.c.PeerAlive(a.node, a.incarnation) {
				attachments++
			}
		}
	}
	return live, attachments, true, nil
}

// attachment is a client of this node holding a slot.
type attachment struct {
	r       *Router
	i       *inst
	c       route.AgentClient
	session string
	sub     *nats.Subscription
	left    atomic.Bool
}

// ToInstance implements route.AgentAttachment.
func (a *attachment) ToInstance(line []byte) bool {
	if a.left.Load() || !a.r.remoteLink(a.i) {
		return false
	}
	return a.r.publish(a.i.in, line) == nil
}

// Leave implements route.AgentAttachment.
func (a *attachment) Leave(detach []byte) {
	if !a.left.CompareAndSwap(false, true) {
		return
	}
	if a.sub != nil {
		_ = a.sub.Unsubscribe()
	}
	a.i.mu.Lock()
	delete(a.i.atts, a)
	// From now on every change from this node drops the slot, an attach
	// here among them, before free gets to write.
	a.i.leaving[a.session] = struct{}{}
	a.i.mu.Unlock()
	if detach != nil && a.r.remoteLink(a.i) && len(detach) <= a.r.chunk {
		// Copied into the connection's buffer before PublishMsg returns.
		m := &nats.Msg{Subject: a.i.in, Data: detach, Header: nats.Header{}}
		m.Header.Set(hdrLeft, a.session)
		_ = a.r.nc.PublishMsg(m)
	}
	go a.free()
}

// free gives the slot back and drops the reference. It tries until the
// slot is out of att.<inst> (a later change from this node may carry it
// out first) or the node's connection is closed (the node stops: the
// others prune its entries once it is gone): a slot never given back would
// count against the limit for as long as this node runs.
func (a *attachment) free() {
	r, i := a.r, a.i
	defer r.unref(i)
	i.mu.Lock()
	i.leaving[a.session] = struct{}{}
	i.mu.Unlock()
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := r.changeSet(ctx, i, func(s attSet) (attSet, error) { return s, errUnchanged })
		cancel()
		i.mu.Lock()
		_, still := i.leaving[a.session]
		i.mu.Unlock()
		if !still {
			return
		}
		if r.nc.IsClosed() {
			return
		}
		if try == 0 || try%100 == 0 {
			r.log.Warn("agent: attachment slot not given back yet, trying again", "instance", i.name, "err", err)
		}
		time.Sleep(min(time.Duration(try+1)*maxPause, time.Second))
	}
}
