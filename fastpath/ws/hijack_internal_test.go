package ws

import (
	"sync"
	"sync/atomic"
	"testing"
)

// take and giveUp race when fasthttp hands a connection over while it is
// being closed: exactly one of serve and abandon may win.
func TestHandoverDecidesOnce(t *testing.T) {
	for range 2000 {
		var abandons atomic.Int32
		h := &handover{abandon: func() { abandons.Add(1) }}
		var took atomic.Bool
		var wg sync.WaitGroup
		wg.Add(3)
		go func() { defer wg.Done(); took.Store(h.take()) }()
		go func() { defer wg.Done(); h.giveUp() }()
		go func() { defer wg.Done(); h.giveUp() }() // closes run it once each
		wg.Wait()
		if n := abandons.Load(); took.Load() == (n != 0) || n > 1 {
			t.Fatalf("took %v and abandon ran %d times", took.Load(), n)
		}
	}
}
