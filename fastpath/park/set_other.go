//go:build !linux || nopark

package park

import (
	"bufio"
	"io"
	"syscall"
)

// This build has no sets (the nopark tag selects it on Linux, so that the
// paths without one are tested there): New fails with ErrUnsupported.

// Set is not available in this build.
type Set struct{}

// New returns ErrUnsupported.
func New() (*Set, error) { return nil, ErrUnsupported }

// Close does nothing.
func (p *Set) Close() error { return nil }

// Parked is 0.
func (p *Set) Parked() int { return 0 }

// Registered is 0.
func (p *Set) Registered() int { return 0 }

// NoteParked does nothing.
func (p *Set) NoteParked(int64) {}

// TakeInline is false: nothing wakes.
func (p *Set) TakeInline() bool { return false }

// GetReader is a new read buffer.
func (p *Set) GetReader(size int, r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, size) }

// PutReader does nothing.
func (p *Set) PutReader(*bufio.Reader) {}

// Reg registers nothing.
type Reg struct{}

// Register is false: nothing can wait.
func (r *Reg) Register(*Set, syscall.RawConn, func()) bool { return false }

// Arm fails.
func (r *Reg) Arm() error { return ErrUnsupported }

// Unregister does nothing.
func (r *Reg) Unregister() {}
