//go:build !race

package pushgw

const raceEnabled = false
