//go:build !race

package mailboxbench

const raceEnabled = false
