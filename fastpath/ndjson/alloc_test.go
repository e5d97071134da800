package ndjson

import (
	"strings"
	"testing"
)

// The routing path allocates nothing per line: reading it, scanning it,
// comparing its fields and splicing it into a buffer that has room.

const allocRuns = 1000

func TestReaderAllocatesNothing(t *testing.T) {
	stream := []byte(`{"type":"a"}` + "\n\r\n" + string(typicalFrame) + "\r\n   \n")
	r := NewReader(&repeatReader{data: stream}, 64) // the buffer grows once, for the typical frame
	var err error
	next := func() {
		if _, e := r.Next(); e != nil {
			err = e
		}
	}
	for range 100 {
		next()
	}
	if allocs := testing.AllocsPerRun(allocRuns, next); allocs != 0 {
		t.Errorf("%v allocations per line", allocs)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestScanAllocatesNothing(t *testing.T) {
	lines := [][]byte{
		typicalFrame,
		bigFrame(),
		[]byte(`{"TYPE":"\u0061cp.message","ſession":"s","instance":"i\u00e9","trace":"\u0041b","type":"x","payload":[[[{"a":null}]]]}`),
		[]byte(`{"type":"a","seq":1.5}`), // an error costs nothing either
		[]byte(`{"type":"a","` + strings.Repeat("long key ", 20) + `":1,"` + strings.Repeat(`\u0041`, 40) + `":2}`),
	}
	for _, line := range lines {
		if allocs := testing.AllocsPerRun(allocRuns, func() { Scan(line) }); allocs != 0 {
			t.Errorf("%v allocations scanning %.40q", allocs, line)
		}
	}
}

func TestFieldsAllocateNothing(t *testing.T) {
	line := []byte(`{"type":"relay\u002eheartbeat","instance":"inst","session":"s\u0031","id":"x"}`)
	f, err := Scan(line)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 64)
	allocs := testing.AllocsPerRun(allocRuns, func() {
		if !f.IsControl(line) || !f.Session.Equal(line, "s1") || !f.Instance.Equal(line, "inst") {
			t.Fatal("wrong field values")
		}
		buf = f.Session.AppendValue(buf[:0], line)
	})
	if allocs != 0 {
		t.Errorf("%v allocations", allocs)
	}
}

func TestSpliceAllocatesNothing(t *testing.T) {
	for _, line := range [][]byte{
		typicalFrame,
		bigFrame(),
		[]byte(`{"session":"1","instance":"2","session":"3","Instance":"4","SESSION":"5","type":"a"}`), // slow path
	} {
		f, err := Scan(line)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, 0, len(line)+128)
		allocs := testing.AllocsPerRun(allocRuns, func() {
			dst = Splice(dst[:0], line, f, benchInstance, []byte("att-\"01\""))
		})
		if allocs != 0 {
			t.Errorf("%v allocations splicing %.40q", allocs, line)
		}
	}
}
