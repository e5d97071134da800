package route

import (
	"context"
	"sync"
	"sync/atomic"
)

// Signals is where the two sides of a mailbox's signal rendezvous meet:
// on this node (LocalSignals) or on any node of a cluster
// (store/cluster/signalroute). The handler keeps the socket, its frame
// bucket and its queue; the router finds the other side.
type Signals interface {
	// Join makes sock side (0 primary, 1 companion) of the mailbox name,
	// replacing an earlier socket of that side wherever it is (that one
	// is told Replaced). When the other side is connected, both are told
	// Peer(true).
	Join(ctx context.Context, name string, side int, sock SignalSocket) (SignalSide, error)
	// CloseAll tells this node's sockets of name Erased (the mailbox is
	// gone: every node calls it from the store's OnGone).
	CloseAll(name string)
}

// SignalSocket is the handler's side of one signal socket. Its methods
// must not block (they queue onto the socket).
type SignalSocket interface {
	// Frame is a binary frame from the other side.
	Frame(msg []byte)
	// Peer says the other side connected (true: "peer 1") or left
	// (false: "peer 0").
	Peer(up bool)
	// Replaced: a newer socket took this side (close 4000).
	Replaced()
	// Erased: the mailbox is gone (close 1000).
	Erased()
	// GoingAway: the relay closes the socket as on a drain (close 1001):
	// a fenced cluster node's sides reconnect.
	GoingAway()
}

// SignalSide is one joined socket's way to the other side.
type SignalSide interface {
	// Send forwards a binary frame to the other side if it is connected,
	// else drops it.
	Send(msg []byte)
	// Leave ends the socket's turn: the other side is told Peer(false),
	// unless a newer socket replaced this one.
	Leave()
}

// LocalSignals meets both sides in this process.
type LocalSignals struct {
	mu    sync.Mutex
	rooms map[string]*localRoom
}

// localRoom is one mailbox's rendezvous; it lives while a socket uses it.
// Frames look the other side up on every forward, so the sides are atomic
// (no lock on the frame path); joins and leaves change them under the
// router's lock, which orders a replacement against the peer notices.
type localRoom struct {
	sides [2]atomic.Pointer[socketRef]
	users int // router mu held
}

// socketRef boxes a SignalSocket for an atomic pointer.
type socketRef struct{ sock SignalSocket }

func (r *socketRef) socket() SignalSocket {
	if r == nil {
		return nil
	}
	return r.sock
}

// NewLocalSignals returns the single node's router.
func NewLocalSignals() *LocalSignals { return &LocalSignals{rooms: make(map[string]*localRoom)} }

var _ Signals = (*LocalSignals)(nil)

type localSide struct {
	s    *LocalSignals
	name string
	room *localRoom
	me   int
	ref  *socketRef
	once sync.Once
}

func (s *LocalSignals) Join(_ context.Context, name string, side int, sock SignalSocket) (SignalSide, error) {
	s.mu.Lock()
	room := s.rooms[name]
	if room == nil {
		room = &localRoom{}
		s.rooms[name] = room
	}
	room.users++
	ref := &socketRef{sock}
	old := room.sides[side].Swap(ref).socket()
	peer := room.sides[1-side].Load().socket()
	s.mu.Unlock()
	if old != nil {
		old.Replaced()
	}
	if peer != nil {
		peer.Peer(true)
		sock.Peer(true)
	}
	return &localSide{s: s, name: name, room: room, me: side, ref: ref}, nil
}

// Send looks the other side up: two atomic loads, the frame path's only
// cost beyond the socket's own queue. A replaced socket sends nothing.
func (l *localSide) Send(msg []byte) {
	if l.room.sides[l.me].Load() != l.ref {
		return
	}
	if peer := l.room.sides[1-l.me].Load().socket(); peer != nil {
		peer.Frame(msg)
	}
}

func (l *localSide) Leave() {
	l.once.Do(func() {
		s := l.s
		s.mu.Lock()
		var peer SignalSocket
		if l.room.sides[l.me].CompareAndSwap(l.ref, nil) {
			peer = l.room.sides[1-l.me].Load().socket()
		}
		if l.room.users--; l.room.users == 0 && s.rooms[l.name] == l.room {
			delete(s.rooms, l.name)
		}
		s.mu.Unlock()
		if peer != nil {
			peer.Peer(false)
		}
	})
}

func (s *LocalSignals) CloseAll(name string) {
	s.mu.Lock()
	var socks []SignalSocket
	if room := s.rooms[name]; room != nil {
		for i := range room.sides {
			if sock := room.sides[i].Swap(nil).socket(); sock != nil {
				socks = append(socks, sock)
			}
		}
	}
	s.mu.Unlock()
	for _, sock := range socks {
		sock.Erased()
	}
}

// Rooms is the number of mailboxes with a signal socket here (tests).
func (s *LocalSignals) Rooms() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rooms)
}
