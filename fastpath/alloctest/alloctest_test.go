package alloctest

import (
	"errors"
	"testing"
)

var sink []byte

func TestMeasureCountsAllocations(t *testing.T) {
	if RaceEnabled() {
		t.Skip("allocation counts are not meaningful under -race")
	}
	// The exact count is the whole process's: the runtime and the test
	// framework may allocate a little meanwhile, never once per run.
	none := Measure(t, 10, 1000, func() error { return nil })
	if none.PerRun != 0 || none.Exact() >= 1 || none.Runs != 1000 {
		t.Fatalf("a step that allocates nothing: %+v", none)
	}
	one := Measure(t, 10, 1000, func() error { sink = make([]byte, 64); return nil })
	if one.PerRun != 1 || one.Exact() < 1 || one.Exact() >= 2 {
		t.Fatalf("a step that allocates once: %+v", one)
	}
}

func TestMeasureFailsOnStepError(t *testing.T) {
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		Measure(ft, 1, 1, func() error { return errors.New("broken") })
	}()
	if !ft.failed {
		t.Fatal("a failing step did not fail the test")
	}
}

// fakeT records Fatal instead of ending the test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatal(args ...any) {
	f.failed = true
	panic("fatal")
}
