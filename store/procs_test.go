package store

import (
	"os"
	"runtime"
	"testing"
)

// TestEnsureProcs: one P is raised to MinProcs, more are left alone, and
// an operator's GOMAXPROCS is obeyed even when it is 1.
func TestEnsureProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		defer os.Setenv("GOMAXPROCS", v)
	} else {
		defer os.Unsetenv("GOMAXPROCS")
	}
	if err := os.Unsetenv("GOMAXPROCS"); err != nil {
		t.Fatal(err)
	}

	runtime.GOMAXPROCS(1)
	if procs, raised := EnsureProcs(); procs != MinProcs || !raised || runtime.GOMAXPROCS(0) != MinProcs {
		t.Errorf("from 1 P: EnsureProcs = %d, %v; GOMAXPROCS %d; want %d, true", procs, raised, runtime.GOMAXPROCS(0), MinProcs)
	}

	runtime.GOMAXPROCS(MinProcs + 1)
	if procs, raised := EnsureProcs(); procs != MinProcs+1 || raised || runtime.GOMAXPROCS(0) != MinProcs+1 {
		t.Errorf("from %d Ps: EnsureProcs = %d, %v; GOMAXPROCS %d; want it left alone", MinProcs+1, procs, raised, runtime.GOMAXPROCS(0))
	}

	for _, ignored := range []string{"", "0", "two"} { // the runtime ignores these too
		t.Setenv("GOMAXPROCS", ignored)
		runtime.GOMAXPROCS(1)
		if procs, raised := EnsureProcs(); procs != MinProcs || !raised {
			t.Errorf("GOMAXPROCS=%q: EnsureProcs = %d, %v; want %d, true", ignored, procs, raised, MinProcs)
		}
	}

	t.Setenv("GOMAXPROCS", "1")
	runtime.GOMAXPROCS(1)
	if procs, raised := EnsureProcs(); procs != 1 || raised || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("GOMAXPROCS=1 set by the operator: EnsureProcs = %d, %v; GOMAXPROCS %d; want it obeyed", procs, raised, runtime.GOMAXPROCS(0))
	}
}
