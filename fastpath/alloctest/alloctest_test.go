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
	none := Measure(t, 10, 100, func() error { return nil })
	if none.PerRun != 0 || none.Mallocs != 0 || none.Runs != 100 {
		t.Fatalf("a step that allocates nothing: %+v", none)
	}
	one := Measure(t, 10, 100, func() error { sink = make([]byte, 64); return nil })
	if one.PerRun != 1 || one.Exact() < 1 {
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
