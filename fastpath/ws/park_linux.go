//go:build linux && !nopark

package ws

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The Linux parker: one epoll set, one goroutine waiting on it. A parked
// socket is registered one-shot (EPOLLONESHOT), level-triggered: arming
// it with bytes already queued in the kernel reports them at once, so a
// frame that arrives while the reader is on its way out is never missed,
// and each arming yields at most one wake.
//
// The epoll set is separate from the Go runtime's own: the runtime keeps
// the fd registered edge-triggered for the reads a woken socket makes
// through net.Conn, and the kernel lets one fd sit in several sets.
//
// epoll's per-event data cannot hold a Go pointer (the collector would not
// see it), so it holds a slot of the parker's table and the slot's
// generation: an event harvested for a socket that has since ended and
// whose slot went to another socket is recognised as stale and dropped.

// parkSupported: this build parks idle sockets.
const parkSupported = true

// maxEvents is how many readiness events one epoll_wait harvests.
const maxEvents = 256

// Parker holds idle sockets off their goroutines (see Options.Parker). One
// Parker serves any number of sockets of any number of services; it runs
// one goroutine until Close.
type Parker struct {
	epfd, wakefd int

	mu    sync.Mutex
	slots []parkSlot
	free  []int32

	closeOnce sync.Once
	stopped   chan struct{}

	poolMu  sync.Mutex
	readers map[int]*sync.Pool // read buffers by size

	parked atomic.Int64 // sockets parked now
}

// A parkSlot is one parked (or parkable) socket's entry.
type parkSlot struct {
	w   waker
	gen uint32
}

// A waker is what a parker wakes: a socket whose one-shot registration
// fired.
type waker interface{ wake() }

// NewParker starts a parker.
func NewParker() (*Parker, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ws: epoll_create1: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("ws: eventfd: %w", err)
	}
	// The eventfd's data is a slot no socket ever has: -1.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1, Pad: 0}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wakefd)
		return nil, fmt.Errorf("ws: epoll_ctl eventfd: %w", err)
	}
	p := &Parker{epfd: epfd, wakefd: wakefd, stopped: make(chan struct{})}
	go p.poll()
	return p, nil
}

// Close stops the parker's goroutine and frees its epoll set. Sockets
// still parked stay parked until their timers or a close wakes them; call
// it once every service using the parker has drained.
func (p *Parker) Close() error {
	p.closeOnce.Do(func() {
		one := [8]byte{1}
		_, _ = unix.Write(p.wakefd, one[:])
		<-p.stopped
		_ = unix.Close(p.epfd)
		_ = unix.Close(p.wakefd)
	})
	return nil
}

// Parked is the number of sockets parked now (without a goroutine).
func (p *Parker) Parked() int { return int(p.parked.Load()) }

// Registered is the number of sockets that may park: served, with a slot,
// not yet ended.
func (p *Parker) Registered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.slots) - len(p.free)
}

// noteParked counts a socket into (1) or out of (-1) the parked.
func (p *Parker) noteParked(d int64) { p.parked.Add(d) }

func (p *Parker) poll() {
	defer close(p.stopped)
	var events [maxEvents]unix.EpollEvent
	wakers := make([]waker, 0, maxEvents)
	for {
		n, err := unix.EpollWait(p.epfd, events[:], -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return // the set is gone: nothing can be waited for
		}
		wakers = wakers[:0]
		p.mu.Lock()
		for i := range n {
			slot, gen := events[i].Fd, uint32(events[i].Pad)
			if slot < 0 {
				p.mu.Unlock()
				return // Close
			}
			if int(slot) < len(p.slots) && p.slots[slot].gen == gen && p.slots[slot].w != nil {
				wakers = append(wakers, p.slots[slot].w)
			}
		}
		p.mu.Unlock()
		for _, w := range wakers {
			w.wake()
		}
		clear(wakers)
	}
}

// take gives w a slot and returns the slot and its generation.
func (p *Parker) take(w waker) (int32, uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var slot int32
	if k := len(p.free); k > 0 {
		slot = p.free[k-1]
		p.free = p.free[:k-1]
	} else {
		slot = int32(len(p.slots))
		p.slots = append(p.slots, parkSlot{})
	}
	s := &p.slots[slot]
	s.gen++
	s.w = w
	return slot, s.gen
}

// give frees slot; an event still in flight for it is dropped (its
// generation no longer matches once the slot is taken again).
func (p *Parker) give(slot int32) {
	p.mu.Lock()
	p.slots[slot].w = nil
	p.free = append(p.free, slot)
	p.mu.Unlock()
}

// parkReg is a socket's registration with a parker. mu orders arm (the
// reader's) against unregister (the teardown's, from any goroutine).
type parkReg struct {
	mu    sync.Mutex
	p     *Parker
	rc    syscall.RawConn
	slot  int32
	gen   uint32
	added bool // in the epoll set (armed, or fired and not re-armed)
	// err is what the last epoll_ctl returned (written inside rc.Control,
	// whose callback is a method value made once: no allocation per arm).
	err             error
	armFn, removeFn func(fd uintptr)
}

// register prepares w's socket (rc) for parking; false when it cannot be
// (no raw socket).
func (r *parkReg) register(p *Parker, rc syscall.RawConn, w waker) bool {
	if p == nil || rc == nil {
		return false
	}
	r.p, r.rc = p, rc
	r.slot, r.gen = p.take(w)
	r.armFn, r.removeFn = r.armOn, r.removeFrom
	return true
}

// arm waits (once) for the socket to be readable or hung up; the
// parker's goroutine then calls wake.
func (r *parkReg) arm() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return ErrClosed // torn down
	}
	if err := r.rc.Control(r.armFn); err != nil {
		return fmt.Errorf("ws: park: %w", err)
	}
	return r.err
}

func (r *parkReg) armOn(fd uintptr) {
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd:     r.slot,
		Pad:    int32(r.gen),
	}
	op := unix.EPOLL_CTL_MOD
	if !r.added {
		op = unix.EPOLL_CTL_ADD
	}
	r.err = unix.EpollCtl(r.p.epfd, op, int(fd), &ev)
	if r.err == nil {
		r.added = true
	}
}

// unregister takes the socket out of the set and frees its slot; it runs
// before the socket is closed, so that no later socket given the same fd
// number inherits the registration.
func (r *parkReg) unregister() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return
	}
	if r.added {
		_ = r.rc.Control(r.removeFn)
	}
	r.p.give(r.slot)
	r.p = nil
}

func (r *parkReg) removeFrom(fd uintptr) {
	r.err = unix.EpollCtl(r.p.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	r.added = false
}

// getReader is a read buffer of size bytes over r, from the pool.
func (p *Parker) getReader(size int, r io.Reader) *bufio.Reader {
	if v := p.readerPool(size).Get(); v != nil {
		br := v.(*bufio.Reader)
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, size)
}

// putReader gives an empty read buffer back to the pool.
func (p *Parker) putReader(br *bufio.Reader) {
	br.Reset(nil)
	p.readerPool(br.Size()).Put(br)
}

// readerPool is the pool of read buffers of size bytes (services use a
// handful of sizes: one pool each).
func (p *Parker) readerPool(size int) *sync.Pool {
	p.poolMu.Lock()
	defer p.poolMu.Unlock()
	if p.readers == nil {
		p.readers = make(map[int]*sync.Pool)
	}
	pool := p.readers[size]
	if pool == nil {
		pool = new(sync.Pool)
		p.readers[size] = pool
	}
	return pool
}
