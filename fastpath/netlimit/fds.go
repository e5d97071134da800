package netlimit

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Running out of file descriptors.
//
// accept(2) fails with EMFILE (this process has no descriptor left) or
// ENFILE (the system has none) without taking the connection off the
// kernel's queue: the client has finished its handshake and waits, and the
// next accept fails at once again, so a loop that retries spins on a core
// while clients hang until their own timeouts. fasthttp's accept loop treats
// the error as permanent and stops serving the listener altogether.
//
// So the Listener never returns these errors. It keeps one spare descriptor
// open (the reserve, on /dev/null). On EMFILE or ENFILE it closes the
// reserve, accepts the pending connections and closes each one at once
// (counted as ReasonFDs: the client sees its connection end, it does not
// hang), takes the reserve back, and then waits on the listening socket for
// the next connection before trying a real accept again: no sleeping, no
// spinning. This is libuv's technique (its EMFILE trick); nginx and Go's
// net/http instead pause accepting and leave clients in the backlog.
//
// A connection is shed only when the process cannot hold it and its
// reserve both: after taking each one off the queue, the shedding tries to
// reopen the reserve, and when that works descriptors are free again and the
// connection is served (see adopt). So a connection that arrives as
// descriptors become free is not lost to a shedding that began before.
//
// The shedding works on a second descriptor of the listening socket, made at
// New: the raw connection of a net.Listener refuses Read, which is the only
// way to have the runtime's poller wait for the socket to become readable.
// So a Listener that can shed holds two descriptors besides its socket.
//
// Where shedding cannot work (the reserve could not be reopened because
// another part of the process took the freed descriptor, or the platform has
// no raw accept), Accept backs off between attempts, from fdBackoffMin to
// fdBackoffMax: clients wait in the backlog until descriptors are free.
//
// The log gets one warning when the listener starts refusing, at most one
// more per fdWarnEvery while it goes on, and one line when it serves again.

const (
	fdBackoffMin = 5 * time.Millisecond
	fdBackoffMax = 100 * time.Millisecond
	fdWarnEvery  = 10 * time.Second
)

// errNoReserve: the listener holds no spare descriptor to free, so a
// pending connection cannot be taken off the queue.
var errNoReserve = errors.New("netlimit: no spare file descriptor")

// outOfFDs reports whether err is accept's "no descriptor for the new
// connection" (EMFILE or ENFILE).
func outOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// kernelShort reports whether err is accept failing for lack of kernel
// memory (ENOBUFS, ENOMEM): like running out of descriptors it passes when
// load drops, so the listener waits it out instead of handing fasthttp an
// error that would stop the server. No connection can be taken off the
// queue then, so nothing is shed: the listener only backs off.
func kernelShort(err error) bool {
	return errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// fdGuard is a Listener's state for riding out descriptor exhaustion. Its
// fields are guarded by mu: net.Listener allows concurrent Accept calls, and
// Close comes from another goroutine.
type fdGuard struct {
	mu       sync.Mutex
	reserve  int  // the spare descriptor; -1 when not held
	closed   bool // the listener is closed: never reopen the reserve
	log      *slog.Logger
	episode  bool      // refusing since the last successful accept
	since    time.Time // when the episode started
	refused  int       // connections shed in this episode
	lastWarn time.Time // last warning written (zero: never)
	warned   bool      // a warning was written in this episode
	backoff  time.Duration

	// inEpisode mirrors episode so that an ordinary accept checks it
	// without taking mu.
	inEpisode atomic.Bool
	done      chan struct{} // closed by close, ends a back-off
	once      sync.Once
}

// newFDGuard holds a reserve only when it can be used (canShed).
func newFDGuard(canShed bool) *fdGuard {
	g := &fdGuard{reserve: -1, done: make(chan struct{})}
	if canShed {
		g.reserve = openReserve()
	}
	return g
}

// release closes the reserve so that one descriptor is free; it reports
// whether it held one.
func (g *fdGuard) release() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reserve < 0 {
		return false
	}
	closeFD(g.reserve)
	g.reserve = -1
	return true
}

// retake reopens the reserve if it is not held and the listener is open;
// it reports whether the reserve is held.
func (g *fdGuard) retake() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reserve < 0 && !g.closed {
		g.reserve = openReserve()
	}
	return g.reserve >= 0
}

// close gives the reserve back for good; the listener is closing.
func (g *fdGuard) close() {
	g.mu.Lock()
	if g.reserve >= 0 {
		closeFD(g.reserve)
		g.reserve = -1
	}
	g.closed = true
	g.mu.Unlock()
	g.once.Do(func() { close(g.done) })
}

// holding reports whether the reserve is held (for tests).
func (g *fdGuard) holding() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reserve >= 0
}

// wait sleeps for the current back-off (doubling it for next time) or until
// the listener closes.
func (g *fdGuard) wait() {
	g.mu.Lock()
	d := max(g.backoff, fdBackoffMin)
	g.backoff = min(2*d, fdBackoffMax)
	g.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.done:
	}
}

// shed counts one connection closed for lack of descriptors.
func (g *fdGuard) shed() {
	g.mu.Lock()
	g.refused++
	g.mu.Unlock()
}

// exhausted notes an accept failure for lack of descriptors and writes the
// warning when one is due: at the start of an episode, then at most one per
// fdWarnEvery, whatever the number of attempts.
func (g *fdGuard) exhausted(now time.Time, err error, open int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.episode {
		g.episode, g.since, g.refused, g.warned = true, now, 0, false
		g.inEpisode.Store(true)
	}
	if g.log == nil || (!g.lastWarn.IsZero() && now.Sub(g.lastWarn) < fdWarnEvery) {
		return
	}
	g.lastWarn, g.warned = now, true
	g.log.Warn("out of file descriptors: new connections are closed at accept until some close (raise the open-files limit or lower the connection caps)",
		"err", err.Error(), "refused", g.refused, "since", g.since.UTC().Format(time.RFC3339), "open_connections", open)
}

// shortOfMemory notes an accept that failed for lack of kernel memory and
// writes a warning at most once per fdWarnEvery (shared with the descriptor
// warnings: both say the machine is out of a resource).
func (g *fdGuard) shortOfMemory(now time.Time, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.log == nil || (!g.lastWarn.IsZero() && now.Sub(g.lastWarn) < fdWarnEvery) {
		return
	}
	g.lastWarn = now
	g.log.Warn("accept failed for lack of kernel memory: waiting before accepting again", "err", err.Error())
}

// accepted ends an episode: the listener serves again. The reserve is
// retaken here too in case the shedding could not reopen it (canShed: the
// listener uses one).
func (g *fdGuard) accepted(now time.Time, canShed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.backoff = 0
	if canShed && g.reserve < 0 && !g.closed {
		g.reserve = openReserve()
	}
	if !g.episode {
		return
	}
	g.episode = false
	g.inEpisode.Store(false)
	// Said only when the episode was announced, so that a flapping limit
	// writes no more lines than the warnings allow.
	if g.log != nil && g.warned {
		g.log.Info("file descriptors available again: accepting connections",
			"refused", g.refused, "lasted", now.Sub(g.since).Round(time.Millisecond).String())
	}
}
