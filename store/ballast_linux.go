package store

import (
	"os"
	"syscall"
)

// allocate reserves size bytes of blocks for f without writing them.
func allocate(f *os.File, size int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
		if err != syscall.EINTR {
			if err == syscall.EOPNOTSUPP {
				return writeZeros(f, size)
			}
			return err
		}
	}
}
