package cluster

import (
	"fmt"
	"testing"
	"time"
)

// TestLogLimit: a recurring failure is logged once and then once per
// interval, a new reason at once (whatever its case), and the limiter's
// memory stays bounded however many reasons it sees.
func TestLogLimit(t *testing.T) {
	l := logLimit{every: time.Hour}
	if !l.due("nats: authorization violation") {
		t.Fatal("a first message is not due")
	}
	if l.due("nats: authorization violation") || l.due("nats: Authorization Violation") {
		t.Fatal("a repeated message (in either case) is due within the interval")
	}
	if !l.due("tls: failed to verify certificate") {
		t.Fatal("a new reason is not due at once")
	}
	for i := range 3 * maxLogMessages {
		l.due(fmt.Sprint("reason ", i))
		if len(l.last) > maxLogMessages {
			t.Fatalf("%d messages remembered, at most %d", len(l.last), maxLogMessages)
		}
	}

	short := logLimit{every: 20 * time.Millisecond}
	short.due("x")
	deadline := time.Now().Add(5 * time.Second)
	for !short.due("x") {
		if time.Now().After(deadline) {
			t.Fatal("a repeated message is never due again after the interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
