package mailbox

import (
	"sync"
	"sync/atomic"

	"edgerelay/fastpath/ws"
)

// signalSides holds the two sockets of a mailbox's signal rendezvous:
// [0] primary, [1] companion. Frames look the other side up on every
// forward, so the pointers are atomic rather than under a lock.
type signalSides [2]atomic.Pointer[ws.Conn]

// signalRoom is one mailbox's signal rendezvous on this node.
type signalRoom struct {
	sides signalSides
	// mu orders a side's replacement against the other side's peer
	// notices; sockets counts the sockets using the room (rooms mu held).
	mu      sync.Mutex
	sockets int
}

// signalRooms holds the rooms of the mailboxes with a signal socket on
// this node; a room lives while a socket uses it, so memory follows the
// open sockets, which the listener's connection limit bounds.
type signalRooms struct {
	mu sync.Mutex
	m  map[string]*signalRoom
}

func newSignalRooms() *signalRooms { return &signalRooms{m: make(map[string]*signalRoom)} }

// join returns name's room, counting the caller's socket in it.
func (r *signalRooms) join(name string) *signalRoom {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.m[name]
	if room == nil {
		room = &signalRoom{}
		r.m[name] = room
	}
	room.sockets++
	return room
}

// leave ends the caller's use of name's room.
func (r *signalRooms) leave(name string, room *signalRoom) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if room.sockets--; room.sockets == 0 && r.m[name] == room {
		delete(r.m, name)
	}
}

// closeAll closes the signal sockets of a mailbox that is gone with 1000
// (store.Mailboxes.OnGone: called for an erase or expiry on any node).
func (r *signalRooms) closeAll(name string) {
	r.mu.Lock()
	room := r.m[name]
	r.mu.Unlock()
	if room == nil {
		return
	}
	for i := range room.sides {
		if c := room.sides[i].Swap(nil); c != nil {
			c.Close(ws.CloseNormal, "mailbox erased")
		}
	}
}

// len is the number of rooms (tests).
func (r *signalRooms) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}
