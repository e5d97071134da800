package proccpu

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

var errNoThread = errors.New("proccpu: no such thread")

// getAffinity is sched_getaffinity(tid) (0: the calling thread).
func getAffinity(tid int) (cpuMask, error) {
	var m cpuMask
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, uintptr(tid), unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m)))
	if e != 0 {
		return m, fmt.Errorf("proccpu: sched_getaffinity: %w", e)
	}
	return m, nil
}

// setAffinity is sched_setaffinity(tid).
func setAffinity(tid int, m *cpuMask) error {
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(*m), uintptr(unsafe.Pointer(m)))
	switch e {
	case 0:
		return nil
	case syscall.ESRCH:
		return errNoThread
	default:
		return fmt.Errorf("proccpu: sched_setaffinity(%d): %w", tid, e)
	}
}
