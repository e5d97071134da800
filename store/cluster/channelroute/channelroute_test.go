package channelroute_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/fastpath/channel/control"
	"edgerelay/route"
	"edgerelay/store"
	"edgerelay/store/cluster"
	"edgerelay/store/cluster/channelroute"
	"edgerelay/store/cluster/clustertest"
)

// sink is a socket that keeps what it is sent.
type sink struct {
	mu     sync.Mutex
	frames []string
	code   int
	closed chan struct{}
}

func newSink() *sink { return &sink{closed: make(chan struct{})} }

func (s *sink) WriteText(p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.code != 0 {
		return errors.New("closed")
	}
	s.frames = append(s.frames, string(p))
	return nil
}

func (s *sink) Close(code int, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.code == 0 {
		s.code = code
		close(s.closed)
	}
}

func (s *sink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.frames...)
}

// waitFrame waits until the sink got want (in order after what it had).
func (s *sink) waitFrame(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range s.all() {
			if f == want {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("never got %q; got %q", want, s.all())
}

func (s *sink) waitClosed(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-s.closed:
	case <-time.After(within):
		t.Fatalf("not closed within %v", within)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.code
}

func (s *sink) has(want string) bool {
	for _, f := range s.all() {
		if f == want {
			return true
		}
	}
	return false
}

func newKey(t testing.TB) store.Hash {
	var k store.Hash
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	return k
}

func newID(t testing.TB) control.ID {
	var raw [16]byte
	var id control.ID
	if _, err := rand.Read(raw[:]); err != nil {
		t.Fatal(err)
	}
	hex.Encode(id[:], raw[:])
	return id
}

func openMsg(id control.ID) string  { return string(control.AppendOpen(nil, &id)) }
func closeMsg(id control.ID) string { return string(control.AppendClose(nil, &id)) }
func dataMsg(id control.ID, d string) string {
	return string(control.AppendData(nil, &id, []byte(d)))
}

func routers(t testing.TB, nodes *clustertest.Nodes) []*channelroute.Router {
	return routersWith(t, nodes, channelroute.Config{})
}

func routersWith(t testing.TB, nodes *clustertest.Nodes, cfg channelroute.Config) []*channelroute.Router {
	rs := clustertest.Open(t, nodes, func(ctx context.Context, c *cluster.Cluster) (*channelroute.Router, error) {
		return channelroute.New(ctx, c, cfg)
	})
	for _, r := range rs {
		t.Cleanup(func() { r.Close() })
	}
	return rs
}

// host opens and attaches a control socket for key through r.
func host(t *testing.T, r route.Channel, key store.Hash) (route.ChannelHost, *sink) {
	t.Helper()
	h, err := r.Host(clustertest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	ctl := newSink()
	if !h.Attach(ctl) {
		t.Fatal("attach refused")
	}
	return h, ctl
}

// phone admits and attaches a phone through r; the computer sees open.
func phone(t *testing.T, r route.Channel, key store.Hash, ctl *sink) (route.ChannelPhone, control.ID, *sink) {
	t.Helper()
	id := newID(t)
	p, err := r.Phone(clustertest.Context(t), key, id)
	if err != nil {
		t.Fatal(err)
	}
	s := newSink()
	if !p.Attach(clustertest.Context(t), s) {
		t.Fatal("phone attach refused")
	}
	ctl.waitFrame(t, openMsg(id))
	return p, id, s
}

func TestFramesAcrossNodesAndOneHolder(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	key, other := newKey(t), newKey(t)
	h, ctl := host(t, rs[0], key)
	_, octl := host(t, rs[2], other)

	// One control socket per computer in the cluster: here and elsewhere.
	for i, r := range rs {
		if _, err := r.Host(clustertest.Context(t), key); !errors.Is(err, route.ErrChannelHeld) {
			t.Fatalf("second control socket through node %d: %v, want held", i, err)
		}
	}
	for i, r := range rs {
		if ok, err := r.Connected(clustertest.Context(t), key); err != nil || !ok {
			t.Fatalf("connected through node %d: %v %v", i, ok, err)
		}
	}

	p1, id1, s1 := phone(t, rs[1], key, ctl)
	p2, id2, s2 := phone(t, rs[2], key, ctl)
	p0, id0, s0 := phone(t, rs[0], key, ctl) // same node: no NATS
	po, ido, so := phone(t, rs[1], other, octl)

	for i, p := range []route.ChannelPhone{p0, p1, p2} {
		if err := p.ToHost([]byte(fmt.Sprintf("up \"%d\"\n", i))); err != nil {
			t.Fatal(err)
		}
	}
	ctl.waitFrame(t, dataMsg(id0, "up \"0\"\n"))
	ctl.waitFrame(t, dataMsg(id1, "up \"1\"\n"))
	ctl.waitFrame(t, dataMsg(id2, "up \"2\"\n"))
	for _, c := range []struct {
		id control.ID
		s  *sink
	}{{id0, s0}, {id1, s1}, {id2, s2}} {
		if !h.ToPhone(&c.id, []byte("down "+string(c.id[:4]))) {
			t.Fatal("ToPhone found no phone")
		}
		c.s.waitFrame(t, "down "+string(c.id[:4]))
	}
	// A phone reaches only its own computer, and an id of another
	// computer's phone reaches nobody.
	if err := po.ToHost([]byte("other")); err != nil {
		t.Fatal(err)
	}
	octl.waitFrame(t, dataMsg(ido, "other"))
	if h.ToPhone(&ido, []byte("stray")) {
		t.Fatal("a computer reached another computer's phone")
	}
	if ctl.has(dataMsg(ido, "other")) || so.has("stray") {
		t.Fatal("frames crossed computers")
	}

	// The computer's close: 1000 on the phone, no close to the computer.
	if !h.ClosePhone(&id1) {
		t.Fatal("ClosePhone found no phone")
	}
	if code := s1.waitClosed(t, 2*time.Second); code != 1000 {
		t.Fatalf("closed by the computer: %d, want 1000", code)
	}
	p1.End()
	// The phone leaving: the computer gets close.
	p2.End()
	ctl.waitFrame(t, closeMsg(id2))
	if ctl.has(closeMsg(id1)) {
		t.Fatal("the computer was told about its own close")
	}

	// The control socket ending closes its phones on every node with
	// 1001 and none of the other computer's.
	p3, _, s3 := phone(t, rs[2], key, ctl)
	_ = p3
	h.End()
	for _, s := range []*sink{s0, s3} {
		if code := s.waitClosed(t, 2*time.Second); code != 1001 {
			t.Fatalf("phone after the control socket ended: %d, want 1001", code)
		}
	}
	if err := po.ToHost([]byte("still")); err != nil {
		t.Fatal(err)
	}
	octl.waitFrame(t, dataMsg(ido, "still"))
	select {
	case <-so.closed:
		t.Fatal("another computer's phone was closed")
	default:
	}

	// Gone everywhere: no phone admitted, the socket free on another node.
	waitCond(t, "the lease free", func() bool {
		ok, err := rs[1].Connected(clustertest.Context(t), key)
		return err == nil && !ok
	})
	if _, err := rs[1].Phone(clustertest.Context(t), key, newID(t)); !errors.Is(err, route.ErrChannelOffline) {
		t.Fatalf("phone for an offline computer: %v", err)
	}
	h2, ctl2 := host(t, rs[2], key)
	defer h2.End()
	phone(t, rs[0], key, ctl2)
}

func TestPhoneLimitExactAcrossNodes(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	key := newKey(t)
	h, ctl := host(t, rs[0], key)
	defer h.End()
	var reserved []route.ChannelPhone
	for i := range route.ChannelMaxPhones {
		r := rs[i%3]
		if i%2 == 0 { // half of them admitted only (upgrade in flight)
			p, err := r.Phone(clustertest.Context(t), key, newID(t))
			if err != nil {
				t.Fatalf("phone %d: %v", i, err)
			}
			reserved = append(reserved, p)
			continue
		}
		phone(t, r, key, ctl)
	}
	for i, r := range rs {
		if _, err := r.Phone(clustertest.Context(t), key, newID(t)); !errors.Is(err, route.ErrChannelFull) {
			t.Fatalf("phone 33 through node %d: %v, want full", i, err)
		}
	}
	// A reservation given back (the upgrade abandoned) frees one place.
	reserved[1].End()
	waitCond(t, "a place free", func() bool {
		p, err := rs[1].Phone(clustertest.Context(t), key, newID(t))
		if err != nil {
			return false
		}
		defer p.End()
		return true
	})
}

func TestNodeDeath(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	key, other := newKey(t), newKey(t)

	// The phone's node dies: the computer gets close for each of its
	// phones there, and not for the others.
	h, ctl := host(t, rs[0], key)
	_, id1, _ := phone(t, rs[1], key, ctl)
	_, id1b, _ := phone(t, rs[1], key, ctl)
	_, id2, s2 := phone(t, rs[2], key, ctl)
	// And the control socket's node dies: a computer on node 1 with a
	// phone on node 2.
	_, octl := host(t, rs[1], other)
	_, _, so := phone(t, rs[2], other, octl)

	start := time.Now()
	nodes.Stop(1)
	ctl.waitFrame(t, closeMsg(id1))
	ctl.waitFrame(t, closeMsg(id1b))
	if code := so.waitClosed(t, 3*time.Second); code != 1001 {
		t.Fatalf("phone of a dead node's computer: %d, want 1001", code)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Fatalf("node death took %v", d)
	}
	if ctl.has(closeMsg(id2)) {
		t.Fatal("a phone on a live node was reported closed")
	}
	if !h.ToPhone(&id2, []byte("alive")) {
		t.Fatal("phone on node 2 gone")
	}
	s2.waitFrame(t, "alive")
	// The dead node's computer may connect again through another node
	// (once the lease bucket has a leader again, when it was node 1:
	// several seconds).
	waitCondWithin(t, "the dead holder's lease free", 20*time.Second, func() bool {
		h, err := rs[2].Host(clustertest.Context(t), other)
		if err != nil {
			return false
		}
		h.End()
		return true
	})
}

func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitCondWithin(t, what, 5*time.Second, cond)
}

func waitCondWithin(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStaleLeaseDoesNotLockOut: a lease left by a node that runs but
// serves no socket of that computer (its release failed) gives way to a
// control socket on another node; a served one does not.
func TestStaleLeaseDoesNotLockOut(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	key := newKey(t)
	l, err := nodes.Node(0).Leases(clustertest.Context(t), channelroute.LeaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Hold(clustertest.Context(t), "host."+hex.EncodeToString(key[:]), true); err != nil {
		t.Fatal(err)
	}
	h, ctl := host(t, rs[1], key)
	phone(t, rs[2], key, ctl)
	if _, err := rs[0].Host(clustertest.Context(t), key); !errors.Is(err, route.ErrChannelHeld) {
		t.Fatalf("a second control socket after the takeover: %v, want held", err)
	}
	h.End()
	// This node's own stale hold gives way at once.
	if _, _, err := l.Hold(clustertest.Context(t), "host."+hex.EncodeToString(key[:]), true); err != nil {
		t.Fatal(err)
	}
	h0, _ := host(t, rs[0], key)
	h0.End()
}

// TestLostAdmissionsGiveTheirPlaceBack: phones admitted from another node
// whose open never comes (the answer or the abandon lost with a NATS
// hiccup) give their places back after AdmitTTL: 32 of them do not lock
// the computer's phones out.
func TestLostAdmissionsGiveTheirPlaceBack(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	const admitTTL = 2 * time.Second
	rs := routersWith(t, nodes, channelroute.Config{AdmitTTL: admitTTL})
	key := newKey(t)
	h, ctl := host(t, rs[0], key)
	defer h.End()
	for i := range route.ChannelMaxPhones {
		// Admitted and then forgotten by its node: neither Attach nor End.
		if _, err := rs[1+i%2].Phone(clustertest.Context(t), key, newID(t)); err != nil {
			t.Fatalf("admission %d: %v", i, err)
		}
	}
	if _, err := rs[0].Phone(clustertest.Context(t), key, newID(t)); !errors.Is(err, route.ErrChannelFull) {
		t.Fatalf("admission 33: %v, want full", err)
	}
	// Each lost admission expires admitTTL after its own answer, and under
	// load the 32 answers were spread over seconds: phones take the places
	// as they come back, and are kept (a probe that gave its place back
	// would race its close, sent from another node, with the next
	// admission).
	back := 0
	waitCondWithin(t, "every lost admission's place back", admitTTL+5*time.Second, func() bool {
		for back < route.ChannelMaxPhones {
			id := newID(t)
			p, err := rs[1+back%2].Phone(clustertest.Context(t), key, id)
			if errors.Is(err, route.ErrChannelFull) {
				return false
			}
			if err != nil {
				t.Fatalf("admission after the lost ones: %v", err)
			}
			if !p.Attach(clustertest.Context(t), newSink()) {
				t.Fatal("phone attach refused")
			}
			ctl.waitFrame(t, openMsg(id))
			back++
		}
		return true
	})
	// Exactly 32 places: the lost admissions hold none of them any more.
	if _, err := rs[0].Phone(clustertest.Context(t), key, newID(t)); !errors.Is(err, route.ErrChannelFull) {
		t.Fatalf("admission 33 after the places came back: %v, want full", err)
	}
	// Nothing was told to the computer about the lost ones.
	for _, f := range ctl.all() {
		if strings.Contains(f, `"close"`) {
			t.Fatalf("the computer was told %s about a phone it never saw", f)
		}
	}
}

// TestComputerGoneBeforeOpen: a phone admitted through another node whose
// computer leaves before the phone's socket attaches is refused at
// attach (its handler closes it with 1001) instead of staying open with
// nobody to close it.
func TestComputerGoneBeforeOpen(t *testing.T) {
	nodes := clustertest.Start(t, 3)
	rs := routers(t, nodes)
	key := newKey(t)
	h, _ := host(t, rs[0], key)
	p, err := rs[1].Phone(clustertest.Context(t), key, newID(t))
	if err != nil {
		t.Fatal(err)
	}
	h.End()
	if p.Attach(clustertest.Context(t), newSink()) {
		t.Fatal("a phone attached to a computer that left")
	}
	p.End()
}

// TestFenceClosesTheSocketsHere: a fenced node closes with 1001 its
// control socket and its phone of another node's computer; another node's
// sockets stay, and a control socket opened after the fence is served.
func TestFenceClosesTheSocketsHere(t *testing.T) {
	nodes := clustertest.Start(t, 2)
	rs := routers(t, nodes)
	key, other := newKey(t), newKey(t)
	h, ctl := host(t, rs[0], key)
	_, octl := host(t, rs[1], other)
	_, _, away := phone(t, rs[0], other, octl) // its computer on node 1
	_, _, kept := phone(t, rs[1], other, octl) // all on node 1
	nodes.Fence(0, 1)
	if code := ctl.waitClosed(t, 2*time.Second); code != 1001 {
		t.Fatalf("fenced control socket: %d, want 1001", code)
	}
	if code := away.waitClosed(t, 2*time.Second); code != 1001 {
		t.Fatalf("fenced phone of node 1's computer: %d, want 1001", code)
	}
	h.End() // what the handler does when the control socket ends
	select {
	case <-octl.closed:
		t.Fatal("node 1's control socket closed by node 0's fence")
	case <-kept.closed:
		t.Fatal("node 1's phone closed by node 0's fence")
	default:
	}
	// The lease was given back: the computer is served again, here.
	_, ctl2 := host(t, rs[0], key)
	phone(t, rs[1], key, ctl2)
	select {
	case <-ctl2.closed:
		t.Fatal("a control socket opened after the fence was closed")
	default:
	}
}
