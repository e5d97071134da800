package proccpu

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with a space and a parenthesis; utime 250, stime 50.
	line := "4242 (my (odd) srv) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 100 0 0\n"
	got, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "12 (x", "12 (x) S 1 2 3", "12 (x) S 1 2 3 4 5 6 7 8 9 10 u s 0"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestCPUTimeRises(t *testing.T) {
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has counted at least 50 ms (10 ms ticks), or
	// give up after 10 s: on a loaded machine the spinning thread gets
	// only part of a core, so the wall time it takes varies.
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := CPUTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after-before >= 50*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time rose only %v over 10 s of spinning", after-before)
		}
		for start := time.Now(); time.Since(start) < 10*time.Millisecond; {
		}
	}
}

func TestPinSelf(t *testing.T) {
	if err := CanPin(); err != nil {
		t.Skip(err)
	}
	prev, err := getAffinity(0)
	if err != nil {
		t.Fatal(err)
	}
	cpu := runtime.NumCPU() - 1
	restore, err := PinSelf(cpu)
	if err != nil {
		t.Fatal(err)
	}
	if p := runtime.GOMAXPROCS(0); p != 1 {
		t.Errorf("GOMAXPROCS %d while pinned, want 1", p)
	}
	var want cpuMask
	_ = want.set(cpu)
	// Every thread, not only this one.
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		var tid int
		for _, c := range e.Name() {
			tid = tid*10 + int(c-'0')
		}
		m, err := getAffinity(tid)
		if err != nil {
			continue // ended meanwhile
		}
		if m != want {
			t.Errorf("thread %d: affinity %x, want %x", tid, m[0], want[0])
		}
	}
	restore()
	if m, err := getAffinity(0); err != nil || m != prev {
		t.Errorf("after restore: %x (%v), want %x", m[0], err, prev[0])
	}
}
