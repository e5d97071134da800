//go:build !linux || nopark

package ws

import (
	"bufio"
	"io"
	"syscall"
)

// This build keeps a goroutine on every socket (the nopark tag selects it
// on Linux, so that both paths are tested there).

const parkSupported = false

// Parker is not available in this build: NewParker fails, and a nil
// Parker parks nothing.
type Parker struct{}

// NewParker returns ErrParkUnsupported.
func NewParker() (*Parker, error) { return nil, ErrParkUnsupported }

// Close does nothing.
func (p *Parker) Close() error { return nil }

// Parked is 0.
func (p *Parker) Parked() int { return 0 }

// Registered is 0.
func (p *Parker) Registered() int { return 0 }

func (p *Parker) noteParked(int64) {}

type waker interface{ wake() }

type parkReg struct{}

func (r *parkReg) register(*Parker, syscall.RawConn, waker) bool { return false }
func (r *parkReg) arm() error                                    { return ErrParkUnsupported }
func (r *parkReg) unregister()                                   {}

func (p *Parker) getReader(size int, r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, size) }
func (p *Parker) putReader(*bufio.Reader)                       {}
