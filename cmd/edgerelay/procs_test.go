package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"edgerelay/store"
)

// TestServeRunsWithTwoPs: serve, confined to one core (where Go's default
// is one P), runs with store.MinProcs Ps, unless the operator sets
// GOMAXPROCS, which it obeys; its start-up line says which.
func TestServeRunsWithTwoPs(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Fatalf("taskset (util-linux) is needed to confine serve to one core: %v", err)
	}
	for _, tc := range []struct {
		env  string
		want int
	}{
		{env: "GOMAXPROCS=", want: store.MinProcs},
		{env: "GOMAXPROCS=1", want: 1},
	} {
		s := startServerWith(t, &relayProc{cpu: "0"}, tc.env)
		if got := startingProcs(t, s.stderr.String()); got != tc.want {
			t.Errorf("on one core, %s: serve runs with %d Ps, want %d", tc.env, got, tc.want)
		}
		s.kill()
	}
}

// startingProcs is the gomaxprocs of serve's "starting" log line.
func startingProcs(t *testing.T, log string) int {
	t.Helper()
	for line := range strings.Lines(log) {
		var rec struct {
			Msg        string `json:"msg"`
			GOMAXPROCS *int   `json:"gomaxprocs"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "starting" {
			if rec.GOMAXPROCS == nil {
				t.Fatalf("the starting line has no gomaxprocs: %s", line)
			}
			return *rec.GOMAXPROCS
		}
	}
	t.Fatalf("no starting line in:\n%s", log)
	return 0
}
