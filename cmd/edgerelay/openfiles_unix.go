//go:build unix

package main

import "syscall"

// openFilesLimit is the process's soft RLIMIT_NOFILE (Go raises it to the
// hard limit at start).
func openFilesLimit() (uint64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, false
	}
	return uint64(rl.Cur), true
}
