package agent

import (
	"sync"
	"sync/atomic"
)

// The link's queue is one buffer of bytes (sendq), shared by the clients
// here, who wait for room, and those on other nodes, whose lines the route
// offers without waiting (remoteLink.Offer). When such a line finds the
// queue full, the client to close is the one holding the most of it, not
// whoever's line happened to arrive: a client colliding with a flooder
// would wait on one node. share is what tells them apart: the bytes that
// remote clients' lines hold in the queue, by session.
//
// The queue does not say whose bytes it has written, so share keeps the
// remote lines in queue order (runs of one session's lines as one run)
// with the queue's running total of bytes put at each run's end; what the
// writer has written is that total less what is queued, and a run whose end
// it has passed holds nothing any more. Bounded: at most maxRuns runs (past
// them the oldest run counts as written: a flood is one run however long,
// so only clients interleaving tiny lines are undercounted) and one entry
// per session seen, dropped when no run holds bytes and there are more
// than maxShareEntries of them.
type share struct {
	put atomic.Int64 // bytes put into the queue, by anyone, ever

	mu      sync.Mutex
	entries map[string]*shareEntry
	runs    [maxRuns]shareRun // a ring, oldest at head
	head, n int
}

// shareEntry is one session's bytes in the queue.
type shareEntry struct {
	session string
	held    int64
}

// shareRun is a run of one session's lines in the queue, ending at the
// put total end.
type shareRun struct {
	e         *shareEntry
	size, end int64
}

const (
	maxRuns         = 1024
	maxShareEntries = 4 * DefaultMaxAttachments
)

// counted adds n bytes put into the queue (every put of the link counts,
// after it succeeded).
func (s *share) counted(n int) int64 { return s.put.Add(int64(n)) }

// forget drops the runs the writer has written, queued being what the
// queue holds now; s.mu is held.
func (s *share) forgetLocked(queued int) {
	written := s.put.Load() - int64(queued)
	for s.n > 0 {
		r := &s.runs[s.head]
		if r.end > written {
			return
		}
		r.e.held -= r.size
		*r = shareRun{}
		s.head = (s.head + 1) % maxRuns
		s.n--
	}
}

// add records n bytes of session's line put, the put total then being
// end; s.mu is held.
func (s *share) addLocked(session []byte, n int, end int64) {
	e := s.entries[string(session)]
	if e == nil {
		if s.entries == nil {
			s.entries = make(map[string]*shareEntry)
		}
		if len(s.entries) >= maxShareEntries {
			for k, old := range s.entries {
				if old.held == 0 {
					delete(s.entries, k)
				}
			}
		}
		e = &shareEntry{session: string(session)}
		s.entries[e.session] = e
	}
	e.held += int64(n)
	if s.n > 0 {
		if last := &s.runs[(s.head+s.n-1)%maxRuns]; last.e == e {
			last.size += int64(n)
			last.end = end
			return
		}
	}
	if s.n == maxRuns { // the oldest counts as written
		r := &s.runs[s.head]
		r.e.held -= r.size
		s.head = (s.head + 1) % maxRuns
		s.n--
	}
	s.runs[(s.head+s.n)%maxRuns] = shareRun{e: e, size: int64(n), end: end}
	s.n++
}

// most is the session holding the most of the queue, and how much; s.mu
// is held.
func (s *share) mostLocked() (*shareEntry, int64) {
	var top *shareEntry
	for _, e := range s.entries {
		if e.held > 0 && (top == nil || e.held > top.held) {
			top = e
		}
	}
	if top == nil {
		return nil, 0
	}
	return top, top.held
}
