//go:build !linux

package proccpu

import (
	"errors"
	"runtime"
)

var errNoThread = errors.New("proccpu: no such thread")

var errUnsupported = errors.New("proccpu: pinning needs Linux, not " + runtime.GOOS)

func getAffinity(int) (cpuMask, error) { return cpuMask{}, errUnsupported }
func setAffinity(int, *cpuMask) error  { return errUnsupported }
