//go:build race

package mailbox

// raceEnabled skips the allocation proofs: the race detector allocates for
// its own bookkeeping.
const raceEnabled = true
