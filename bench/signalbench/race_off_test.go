//go:build !race

package signalbench

const raceEnabled = false
