package agentbench

import (
	"syscall"
	"time"
)

// sleepFor blocks the calling thread for about d with nanosleep(2): the
// kernel's high-resolution timers wake it within tens of microseconds,
// where the runtime's timers round up to a millisecond. Other goroutines
// run on other threads meanwhile.
func sleepFor(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_ = syscall.Nanosleep(&ts, nil)
}
