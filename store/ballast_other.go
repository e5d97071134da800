//go:build !linux

package store

import "os"

// allocate writes size zero bytes to f (no fallocate here).
func allocate(f *os.File, size int64) error { return writeZeros(f, size) }
