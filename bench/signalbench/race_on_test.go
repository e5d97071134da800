//go:build race

package signalbench

// raceEnabled skips the allocation assertion: the race detector allocates
// for its own bookkeeping (and sync.Pool drops what is put back at random).
const raceEnabled = true
