package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestStopCodeIncompleteDrainIsACleanStop: a client holding a request past
// RELAY_DRAIN_TIMEOUT must not turn a stop into a failure (exit 0, with a
// warning); only a store that did not close cleanly does (exit 1).
func TestStopCodeIncompleteDrainIsACleanStop(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	if code := stopCode(log, nil, nil); code != 0 {
		t.Fatalf("clean drain: exit %d", code)
	}
	if code := stopCode(log, context.DeadlineExceeded, nil); code != 0 {
		t.Fatalf("drain cut at its bound: exit %d", code)
	}
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"drain incomplete`) {
		t.Fatalf("the cut drain was not logged:\n%s", logs.String())
	}
	if code := stopCode(log, context.DeadlineExceeded, errors.New("store: close: boom")); code != 1 {
		t.Fatalf("store close failed: exit %d", code)
	}
	if !strings.Contains(logs.String(), `"level":"ERROR","msg":"stop failed","err":"store: close: boom"`) {
		t.Fatalf("the failed close was not logged:\n%s", logs.String())
	}
}
