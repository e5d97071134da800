package mailboxlocal

import (
	"testing"

	"edgerelay/store"
)

// TestRemoveWatcherLeavesNoReference: the watcher list keeps its backing
// array while the mailbox stays in memory (up to cacheIdle after its last
// use), so a removed watcher must not stay in a slot past the end: it would
// keep its closed socket's read buffer and send queue reachable (through
// its Deliver). After a
// reconnect storm that is one dead socket per direction of every mailbox.
func TestRemoveWatcherLeavesNoReference(t *testing.T) {
	m := &mailbox{}
	d := &m.dirs[dirIndex(store.DirP2C)]
	a, b, c := &watcher{}, &watcher{}, &watcher{}
	d.watchers = []*watcher{a, b, c}
	for _, step := range []struct {
		remove *watcher
		left   []*watcher
	}{
		{b, []*watcher{a, c}}, // from the middle
		{c, []*watcher{a}},    // the last one
		{a, nil},              // the only one
		{a, nil},              // already gone: nothing changes
	} {
		m.removeWatcher(store.DirP2C, step.remove)
		if len(d.watchers) != len(step.left) {
			t.Fatalf("watchers %v, want %v", d.watchers, step.left)
		}
		for i, w := range step.left {
			if d.watchers[i] != w {
				t.Fatalf("watchers %v, want %v", d.watchers, step.left)
			}
		}
		for i, w := range d.watchers[len(d.watchers):cap(d.watchers)] {
			if w != nil {
				t.Fatalf("slot %d past the end still holds a removed watcher", len(d.watchers)+i)
			}
		}
	}
}
