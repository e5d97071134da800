package acceptidle

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"edgerelay/fastpath/park"
)

// TestMain makes the test binary the server process when asked to
// (Measure appends "-park on|off" to its arguments), so that the test
// measures real servers without building the command.
func TestMain(m *testing.M) {
	if os.Getenv("ACCEPTIDLE_CHILD") == "1" {
		parked := os.Args[len(os.Args)-1] == "on"
		if err := ServeProcess(parked, false, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A short run: parked silent connections hold no goroutine and less
// memory than unparked ones, which hold one each, as do kept-alive ones.
func TestMeasureShort(t *testing.T) {
	if s, err := park.New(); err != nil {
		t.Skip("no park.Set in this build:", err)
	} else {
		s.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 300
	figs, err := Measure(ctx, Options{
		Argv: []string{os.Args[0]}, Env: append(os.Environ(), "ACCEPTIDLE_CHILD=1"), Sockets: n, Aliases: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(figs) != 4 {
		t.Fatalf("%d figures, want 4 (two kinds, two sides)", len(figs))
	}
	byKey := map[string]Figure{}
	for _, f := range figs {
		t.Log(f)
		if f.Sockets != n {
			t.Errorf("%v: %d sockets, want %d", f, f.Sockets, n)
		}
		byKey[fmt.Sprintf("%s %v", f.Kind, f.Parked)] = f
	}
	parked, unparked := byKey["silent true"], byKey["silent false"]
	if parked.GoroutinesPerSocket > 0.05 {
		t.Errorf("parked silent connections hold %.2f goroutines each, want none", parked.GoroutinesPerSocket)
	}
	if unparked.GoroutinesPerSocket < 0.95 {
		t.Errorf("unparked silent connections hold %.2f goroutines each, want one", unparked.GoroutinesPerSocket)
	}
	if p, u := parked.HeapPerSocket+parked.StackPerSocket, unparked.HeapPerSocket+unparked.StackPerSocket; p >= u/2 {
		t.Errorf("parked silent connection %.0f B of heap and stacks, unparked %.0f: want far less", p, u)
	}
	if k := byKey["keepalive false"]; k.GoroutinesPerSocket < 0.95 {
		t.Errorf("kept-alive connections hold %.2f goroutines each, want one (fasthttp's)", k.GoroutinesPerSocket)
	}
}
