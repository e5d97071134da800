package main

import (
	"os"
	"strconv"
	"testing"
)

// soakScale is how many times longer the reliability tests run: 1 in
// `make test`, EDGERELAY_SOAK (set by `make soak`) otherwise. Tests multiply
// their cycles, clients or rounds by it, so that the soak runs the same
// checks as CI, only longer; `go test -timeout` bounds the whole run.
func soakScale(t *testing.T) int {
	t.Helper()
	v := os.Getenv("EDGERELAY_SOAK")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("EDGERELAY_SOAK=%q: want a whole number >= 1", v)
	}
	return n
}
