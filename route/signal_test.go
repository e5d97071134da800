package route_test

import (
	"testing"

	"edgerelay/route"
	"edgerelay/route/routetest"
)

// TestLocalSignals runs the signal router contract on one node.
func TestLocalSignals(t *testing.T) {
	s := route.NewLocalSignals()
	routetest.Signals(t, []route.Signals{s, s, s})
	if n := s.Rooms(); n != 0 {
		t.Fatalf("%d rooms left after every socket left", n)
	}
}
