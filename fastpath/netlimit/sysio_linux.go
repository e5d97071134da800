//go:build linux

package netlimit

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// An accepted connection's reads and writes go to the kernel as raw
// syscalls inside the socket's RawConn callbacks instead of through
// net.Conn. net.Conn enters every read(2) and write(2) through the
// scheduler's syscall path (entersyscall), which wakes the runtime's
// monitor thread (sysmon) whenever the process had gone idle; sysmon then
// polls every 20 µs, backing off only after a millisecond of nothing to
// do. A relay at rest between deliveries took that at every wake: 22.5% of
// the server's CPU in idlebench's wake figure was sysmon's sleeps and
// wakes, triggered by the WebSocket writer's net.Conn.Write. Every socket
// Go makes is non-blocking, so these calls never wait in the kernel: a
// call that would (EAGAIN) returns false from the callback, and the
// RawConn waits in the netpoller just as net.Conn does, with the same
// deadlines and the same wake on Close. The TURN data path does the same
// (turn/gso_linux.go).

// sysOp is one read or write in flight: the buffer, what the kernel did,
// and the callbacks, made once per op (a method value handed to the
// RawConn would otherwise be a closure allocated per call). Ops come from
// the Listener's pool, so that an idle connection holds none.
type sysOp struct {
	p     []byte
	n     int
	errno syscall.Errno
	flags int // recvfrom(2)'s, for tryRead

	read, write, try func(fd uintptr) bool
	tryRead          func(fd uintptr)
}

func newSysOps() *sync.Pool {
	return &sync.Pool{New: func() any {
		o := &sysOp{}
		o.read, o.write, o.try, o.tryRead = o.readOnce, o.writeAll, o.writeRoom, o.recvNow
		return o
	}}
}

// maxRW bounds one read(2) or write(2), as the net package does: some
// kernels refuse bigger counts.
const maxRW = 1 << 30

// call makes one raw read(2) or write(2) (trap) of what is left of p,
// again while interrupted; wait is EAGAIN: nothing to read, or no room.
// Another error is kept in errno.
func (o *sysOp) call(fd, trap uintptr) (n int, wait bool) {
	p := o.p[:min(len(o.p), maxRW)]
	for {
		r, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			return int(r), false
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, true
		}
		o.errno = e
		return 0, false
	}
}

// readOnce reads into p once; false (wait and call again) when nothing
// is there yet.
func (o *sysOp) readOnce(fd uintptr) bool {
	n, wait := o.call(fd, syscall.SYS_READ)
	o.n = n
	return !wait
}

// recvNow reads what is there into p without waiting, with o.flags
// (MSG_PEEK: it stays queued); nothing there is errno EAGAIN.
func (o *sysOp) recvNow(fd uintptr) {
	for {
		r, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&o.p[0])), uintptr(len(o.p)),
			uintptr(o.flags|syscall.MSG_DONTWAIT), 0, 0)
		if e == syscall.EINTR {
			continue
		}
		o.n, o.errno = int(r), e
		if e != 0 {
			o.n = 0
		}
		return
	}
}

// writeAll writes what is left of p; false (wait for room and call again)
// when the socket's buffer is full before the end.
func (o *sysOp) writeAll(fd uintptr) bool {
	for len(o.p) > 0 && o.errno == 0 {
		n, wait := o.call(fd, syscall.SYS_WRITE)
		if wait {
			return false
		}
		if n == 0 && o.errno == 0 {
			// Never from a socket: an error rather than a spin.
			o.errno = syscall.EIO
		}
		o.n += n
		o.p = o.p[n:]
	}
	return true
}

// writeRoom writes what the socket's buffer has room for, and never waits.
func (o *sysOp) writeRoom(fd uintptr) bool {
	o.writeAll(fd)
	return true
}

// rawConnOf is c's RawConn when c is a socket of the net package's (what
// a listener accepts), nil otherwise.
func rawConnOf(c net.Conn) syscall.RawConn {
	sc, ok := c.(interface {
		syscall.Conn
		net.Conn
	})
	if !ok {
		return nil
	}
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nil // a wrapper: its own Read and Write may do more
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// sysRead is net.Conn.Read through a raw read(2).
func (c *conn) sysRead(b []byte) (int, error) {
	if c.rc == nil || len(b) == 0 {
		return c.Conn.Read(b)
	}
	n, err := c.sysDo(opRead, b)
	if n == 0 && err == nil {
		return 0, io.EOF
	}
	return n, err
}

// Write is net.Conn.Write through raw write(2)s: all of b, or what was
// written before the error.
func (c *conn) Write(b []byte) (int, error) {
	if c.rc == nil || len(b) == 0 {
		return c.Conn.Write(b)
	}
	return c.sysDo(opWrite, b)
}

// TryWrite writes what the socket takes of b now, without waiting for
// room: (0, nil) when its buffer is full. It is for a writer that must
// not wait on a slow peer: a WebSocket writes a frame at once from the
// goroutine that queued it and leaves what did not fit to its writer
// (fastpath/ws, Conn.writeNow).
func (c *conn) TryWrite(b []byte) (int, error) {
	if c.rc == nil || len(b) == 0 {
		return 0, nil
	}
	return c.sysDo(opTryWrite, b)
}

// TryRead reads what the socket holds now into b, without waiting and
// whatever the read deadline: (0, nil) when nothing is there, (0, io.EOF)
// once the peer has shut its side. With peek the bytes stay queued for
// the next read (MSG_PEEK). It is for a socket's owner that looks at what
// woke a parked socket before deciding who reads it (fastpath/ws,
// Conn.wakeInline).
func (c *conn) TryRead(b []byte, peek bool) (int, error) {
	if c.rc == nil || len(b) == 0 {
		return 0, nil
	}
	o := c.l.ops.Get().(*sysOp)
	o.p, o.n, o.errno, o.flags = b, 0, 0, 0
	if peek {
		o.flags = syscall.MSG_PEEK
	}
	// Control, not Read: Read refuses at once once the read deadline has
	// passed, and a parked socket's may have (see ws.Conn.readHeader).
	err := c.rc.Control(o.tryRead)
	n, errno := o.n, o.errno
	o.p = nil
	c.l.ops.Put(o)
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno == syscall.EAGAIN:
		return 0, nil
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("recvfrom", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// What sysDo does.
const (
	opRead     = iota // read once into b, waiting for input
	opWrite           // write all of b, waiting for room
	opTryWrite        // write what fits of b, never waiting
)

// sysDo does op with b through the socket's RawConn, with an op from the
// Listener's pool.
func (c *conn) sysDo(op int, b []byte) (int, error) {
	o := c.l.ops.Get().(*sysOp)
	o.p, o.n, o.errno = b, 0, 0
	var err error
	name := "write"
	switch op {
	case opRead:
		name = "read"
		err = c.rc.Read(o.read)
	case opWrite:
		err = c.rc.Write(o.write)
	default:
		err = c.rc.Write(o.try)
	}
	n, errno := o.n, o.errno
	o.p = nil
	c.l.ops.Put(o)
	switch {
	case err != nil:
		return n, c.opError(name, err)
	case errno != 0:
		return n, c.opError(name, os.NewSyscallError(name, errno))
	}
	return n, nil
}

// opError is err as net.Conn would return it: a *net.OpError naming the
// operation and both ends. A RawConn's own error (a deadline, a closed
// connection) comes wrapped for "raw-read"/"raw-write"; what it wraps is
// the net package's (os.ErrDeadlineExceeded, net.ErrClosed).
func (c *conn) opError(op string, err error) error {
	var raw *net.OpError
	if errors.As(err, &raw) {
		err = raw.Err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
