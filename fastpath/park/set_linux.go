//go:build linux && !nopark

package park

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxEvents is how many readiness events one epoll_wait harvests.
const maxEvents = 256

// inlineBudget is how many wakes of one harvest may do their work on the
// set's goroutine (TakeInline): answering a keepalive there saves a
// goroutine per wake, but a burst must still spread over every core, and
// the sockets late in a harvest must not wait behind all the ones before.
const inlineBudget = 16

// A Set holds sockets waiting to become readable. One Set serves any
// number of sockets of any number of services; it runs one goroutine
// until Close.
//
// The set's epoll instance is itself registered with the runtime's
// netpoller (an epoll set is readable while events are ready in it), and
// its goroutine harvests events with non-blocking epoll_wait calls made
// as raw syscalls, parking in the netpoller in between, like a socket's
// reader. A blocking epoll_wait would take the scheduler's syscall path,
// which wakes the runtime's monitor thread (sysmon) whenever the process
// had gone idle: at every wake of a relay at rest, with sysmon then
// polling every 20 µs for a millisecond (fastpath/netlimit/sysio_linux.go
// measured it at a fifth of such a relay's CPU). Arming (epoll_ctl) is a
// raw syscall for the same reason; neither call ever blocks.
type Set struct {
	epfd int
	file *os.File        // owns epfd; closing it ends the harvest
	rc   syscall.RawConn // epfd in the netpoller

	mu    sync.Mutex
	slots []parkSlot
	free  []int32

	closeOnce sync.Once
	stopped   chan struct{}

	poolMu  sync.Mutex
	readers map[int]*sync.Pool // read buffers by size

	parked atomic.Int64 // sockets parked now

	// inlineLeft is the current harvest's budget (TakeInline); only the
	// set's goroutine touches it.
	inlineLeft int
}

// A parkSlot is one registered socket's entry: what its event calls.
type parkSlot struct {
	wake func()
	gen  uint32
}

// New starts a set.
func New() (*Set, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("park: epoll_create1: %w", err)
	}
	// Non-blocking, os.NewFile registers it with the netpoller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("park: epoll set non-blocking: %w", err)
	}
	file := os.NewFile(uintptr(epfd), "park epoll set")
	// A deadline can be set only on what the netpoller took.
	if err := file.SetReadDeadline(time.Time{}); err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("park: the runtime's netpoller does not take an epoll set: %w", err)
	}
	rc, err := file.SyscallConn()
	if err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("park: epoll set: %w", err)
	}
	p := &Set{epfd: epfd, file: file, rc: rc, stopped: make(chan struct{})}
	go p.poll()
	return p, nil
}

// Close stops the set's goroutine and frees its epoll set. Sockets still
// registered are not woken by it any more; call it once every service
// using the set has drained.
func (p *Set) Close() error {
	p.closeOnce.Do(func() {
		_ = p.file.Close() // the harvest's wait ends with an error
		<-p.stopped
	})
	return nil
}

// Parked is the number of sockets parked now (see NoteParked).
func (p *Set) Parked() int { return int(p.parked.Load()) }

// Registered is the number of sockets that may park: served, with a slot,
// not yet ended.
func (p *Set) Registered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.slots) - len(p.free)
}

// NoteParked counts a socket into (1) or out of (-1) the parked: the
// owner of the socket knows when it holds no goroutine.
func (p *Set) NoteParked(d int64) { p.parked.Add(d) }

// poll harvests events and calls their sockets' wake functions until
// Close.
func (p *Set) poll() {
	defer close(p.stopped)
	var (
		events [maxEvents]unix.EpollEvent
		n      int
		errno  syscall.Errno
	)
	// harvest takes what is ready without waiting; false (wait in the
	// netpoller, then call again) when nothing is.
	harvest := func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, fd,
				uintptr(unsafe.Pointer(&events[0])), maxEvents, 0, 0, 0)
			if e == syscall.EINTR {
				continue
			}
			n, errno = int(r), e
			return e != 0 || n > 0
		}
	}
	wakers := make([]func(), 0, maxEvents)
	for {
		if err := p.rc.Read(harvest); err != nil || errno != 0 {
			return // Close (or the set is gone: nothing can be waited for)
		}
		wakers = wakers[:0]
		p.mu.Lock()
		for i := range n {
			slot, gen := events[i].Fd, uint32(events[i].Pad)
			if int(slot) < len(p.slots) && p.slots[slot].gen == gen && p.slots[slot].wake != nil {
				wakers = append(wakers, p.slots[slot].wake)
			}
		}
		p.mu.Unlock()
		p.inlineLeft = inlineBudget
		for _, wake := range wakers {
			wake()
		}
		clear(wakers)
	}
}

// TakeInline reports whether the wake being called may do its work where
// it is called, on the set's goroutine, and counts it against the
// harvest's budget (inlineBudget): true for the first wakes of each
// harvest. Only for wake functions, which the set's goroutine calls; the
// work must not block.
func (p *Set) TakeInline() bool {
	if p.inlineLeft <= 0 {
		return false
	}
	p.inlineLeft--
	return true
}

// epollCtl is epoll_ctl(2) as a raw syscall (see Set).
func epollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd),
		uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// take gives wake a slot and returns the slot and its generation.
func (p *Set) take(wake func()) (int32, uint32) {
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
	s.wake = wake
	return slot, s.gen
}

// give frees slot; an event still in flight for it is dropped (its
// generation no longer matches once the slot is taken again).
func (p *Set) give(slot int32) {
	p.mu.Lock()
	p.slots[slot].wake = nil
	p.free = append(p.free, slot)
	p.mu.Unlock()
}

// A Reg is one socket's registration with a set. mu orders Arm (the
// socket's reader) against Unregister (its teardown, from any goroutine).
type Reg struct {
	mu sync.Mutex
	p  *Set
	rc syscall.RawConn
	// err is what the last epoll_ctl returned. It is written inside
	// rc.Control, whose callback ctlFn is the method value r.ctl, made
	// once (no allocation per arm), which does what remove says.
	err    error
	ctlFn  func(fd uintptr)
	slot   int32
	gen    uint32
	added  bool // in the epoll set (armed, or fired and not re-armed)
	ended  bool // Unregister has run: Register refuses from then on
	remove bool // ctl takes the socket out of the set (else arms it)
}

// Register prepares the socket rc for waits in p: each Arm then calls
// wake once, on the set's goroutine. wake must not block: it hands the
// socket to a goroutine of its own, or, within the harvest's budget
// (TakeInline), does what needs no wait itself. False when it cannot be
// (no set, no raw socket, or Unregister has run already).
func (r *Reg) Register(p *Set, rc syscall.RawConn, wake func()) bool {
	if p == nil || rc == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return false // torn down before it was served
	}
	r.p, r.rc = p, rc
	r.slot, r.gen = p.take(wake)
	r.ctlFn = r.ctl
	return true
}

// Arm waits (once) for the socket to be readable or hung up; the set's
// goroutine then calls wake. ErrClosed once Unregister has run.
func (r *Reg) Arm() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return ErrClosed
	}
	r.remove = false
	if err := r.rc.Control(r.ctlFn); err != nil {
		return fmt.Errorf("park: arm: %w", err)
	}
	return r.err
}

// ctl arms the socket fd in the set, or takes it out (remove).
func (r *Reg) ctl(fd uintptr) {
	if r.remove {
		r.err = epollCtl(r.p.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
		r.added = false
		return
	}
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd:     r.slot,
		Pad:    int32(r.gen),
	}
	op := unix.EPOLL_CTL_MOD
	if !r.added {
		op = unix.EPOLL_CTL_ADD
	}
	r.err = epollCtl(r.p.epfd, op, int(fd), &ev)
	if r.err == nil {
		r.added = true
	}
}

// Unregister takes the socket out of the set and frees its slot. Call it
// before the socket is closed, so that no later socket given the same fd
// number inherits the registration; any number of times.
func (r *Reg) Unregister() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	if r.p == nil {
		return
	}
	if r.added {
		r.remove = true
		_ = r.rc.Control(r.ctlFn)
	}
	r.p.give(r.slot)
	r.p = nil
}

// GetReader is a read buffer of size bytes over r, from the set's pool:
// a socket that waits gives its buffer back (PutReader) and takes one
// again when it wakes.
func (p *Set) GetReader(size int, r io.Reader) *bufio.Reader {
	if v := p.readerPool(size).Get(); v != nil {
		br := v.(*bufio.Reader)
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, size)
}

// PutReader gives an empty read buffer back to the pool.
func (p *Set) PutReader(br *bufio.Reader) {
	br.Reset(nil)
	p.readerPool(br.Size()).Put(br)
}

// readerPool is the pool of read buffers of size bytes (services use a
// handful of sizes: one pool each).
func (p *Set) readerPool(size int) *sync.Pool {
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
