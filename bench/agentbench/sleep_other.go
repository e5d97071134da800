//go:build !linux

package agentbench

import "time"

// sleepFor is time.Sleep where nanosleep(2) is not at hand; pacing is then
// as coarse as the runtime's timers.
func sleepFor(d time.Duration) { time.Sleep(d) }
