//go:build race

package bucket

// raceEnabled scales down the heaviest test, which the race detector slows
// by an order of magnitude.
const raceEnabled = true
