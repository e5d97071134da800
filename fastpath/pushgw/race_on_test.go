//go:build race

package pushgw

// raceEnabled skips the zero-allocation proofs: under the race detector
// sync.Pool drops items at random, so a pooled value is sometimes new.
const raceEnabled = true
