//go:build linux

package netlimit

import (
	"net"
	"os"
	"syscall"
)

// openReserve opens the spare descriptor: /dev/null, or the root directory
// where there is no /dev (a bare chroot), as libuv does; -1 when neither
// opens (no descriptor is free right now).
func openReserve() int {
	for _, path := range []string{"/dev/null", "/"} {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err == nil {
			return fd
		}
	}
	return -1
}

func closeFD(fd int) { _ = syscall.Close(fd) }

// dupListener returns a second descriptor of ln's socket as a file the
// runtime's poller watches, and its raw connection. It is needed because a
// net.Listener's own raw connection refuses Read (only Control is allowed),
// and Read is what waits for the socket to become readable through the
// poller instead of sleeping. Both are nil when ln is not a socket.
func dupListener(ln net.Listener) (*os.File, syscall.RawConn) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	dup := -1
	err = raw.Control(func(fd uintptr) {
		r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_DUPFD_CLOEXEC, 0)
		if errno == 0 {
			dup = int(r)
		}
	})
	if err != nil || dup < 0 {
		return nil, nil
	}
	// The duplicate shares the socket's O_NONBLOCK, so os.NewFile
	// registers it with the poller and its raw Read can wait.
	f := os.NewFile(uintptr(dup), "listener")
	fraw, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, nil
	}
	return f, fraw
}

// shedPending frees the reserve, accepts each connection waiting on the
// listening socket and closes it at once (counting it as ReasonFDs), takes
// the reserve back, and then waits until another connection arrives or the
// listener closes; it returns nil, nil then, and Accept tries for real.
//
// When the reserve can be reopened with a new connection held, descriptors
// are free again: shedPending stops and returns that connection to be
// served. It returns errNoReserve, or the error that stopped it, when it
// did not get to wait for the next connection: the caller backs off.
func (l *Listener) shedPending() (net.Conn, error) {
	if l.raw == nil || !l.fds.release() {
		return nil, errNoReserve
	}
	var stuck error
	kept := -1
	waiting := false
	err := l.raw.Read(func(fd uintptr) bool {
		if waiting {
			return true // a connection arrived: Accept tries for real
		}
		for {
			nfd, _, err := syscall.Accept4(int(fd), syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
			switch err {
			case nil:
				if l.fds.retake() {
					kept = nfd // descriptors are free again
					return true
				}
				l.refuse(ReasonFDs)
				_ = syscall.Close(nfd)
				l.fds.shed()
			case syscall.EINTR, syscall.ECONNABORTED:
				// Interrupted, or a client that gave up while queued:
				// the next one may be there.
			case syscall.EAGAIN:
				// The queue is empty. Hold the reserve again before
				// waiting, so that the next shedding has one to free;
				// returning false makes the poller wait for the socket
				// to become readable, without losing an arrival that
				// happened since this accept.
				l.fds.retake()
				waiting = true
				return false
			default:
				// EMFILE again (something else in the process took the
				// descriptor just freed) or a failure of its own.
				stuck = err
				return true
			}
		}
	})
	l.fds.retake()
	if kept >= 0 {
		return l.adopt(kept), nil
	}
	if err != nil {
		// The listener was closed while waiting (Accept then reports it;
		// the back-off ends at once) or the poller failed: either way
		// the caller must not retry at once.
		return nil, err
	}
	return nil, stuck
}

// adopt makes a net.Conn of a connection accepted by shedPending, or sheds
// it (nil) when that cannot be done. net.FileConn duplicates the
// descriptor, which takes one more, so the reserve is lent to it: released
// before, taken back once the original is closed.
func (l *Listener) adopt(nfd int) net.Conn {
	f := os.NewFile(uintptr(nfd), "accepted")
	l.fds.release()
	c, err := net.FileConn(f)
	_ = f.Close()
	l.fds.retake()
	if err != nil {
		l.refuse(ReasonFDs)
		l.fds.shed()
		return nil
	}
	return c
}
