//go:build race

package mailboxbench

// raceEnabled skips the allocation proofs (the race detector allocates
// for its own bookkeeping) and shortens the comparisons it slows down.
const raceEnabled = true
