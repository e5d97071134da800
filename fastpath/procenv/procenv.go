// Package procenv builds the environment of the edgerelay processes that
// black-box tests start: the test process's own without its RELAY_*
// settings, then the test's settings on top.
package procenv

import (
	"os"
	"strings"
)

// Merge returns base with every NAME=value of over put in: replacing the
// entry of the same name, or appended.
func Merge(base, over []string) []string {
	out := append([]string(nil), base...)
	for _, kv := range over {
		name, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, b := range out {
			if strings.HasPrefix(b, name+"=") {
				out[i], replaced = kv, true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

// Clean is the test process's environment without RELAY_* settings, and
// with GORACE's atexit_sleep_ms=0: a -race binary sleeps 1 s before it
// exits (so late reports of other goroutines get out), and every command
// and server a suite runs would wait it out (about 90 s of make test). A
// race is still reported, and still fails the exit code.
func Clean() []string {
	var out []string
	gorace := "GORACE=atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "RELAY_"):
		case strings.HasPrefix(kv, "GORACE="):
			gorace = kv + " atexit_sleep_ms=0"
		default:
			out = append(out, kv)
		}
	}
	return append(out, gorace)
}
