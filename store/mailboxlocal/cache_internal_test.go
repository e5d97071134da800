package mailboxlocal

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"edgerelay/fastpath/bucket"
)

// TestCacheEvictsTheLeastRecentlyUsedQuietEntry: at a shard's share
// nothing is evicted; one past it, the least recently used entry is; held
// and busy entries (a request in progress, a watcher's place) never are,
// even past the bound.
func TestCacheEvictsTheLeastRecentlyUsedQuietEntry(t *testing.T) {
	edge := newCache(cacheShards * 2) // two a shard
	var same []string
	want, _ := edge.shard([]byte("chat/edge0"))
	for i := 0; len(same) < 3; i++ {
		name := "chat/edge" + strconv.Itoa(i)
		if sh, _ := edge.shard([]byte(name)); sh == want {
			same = append(same, name)
		}
	}
	for i, name := range same[:2] {
		m := edge.acquire(nil, []byte(name))
		m.lastUse = int64(i + 1)
		m.Release()
	}
	if n := len(want.m); n != 2 {
		t.Fatalf("at the share: %d entries, want 2", n)
	}
	edge.acquire(nil, []byte(same[2])).Release()
	if _, ok := want.m[same[0]]; ok || len(want.m) != 2 {
		t.Fatalf("one past the share: entries %v, want the least recently used (%s) evicted", want.m, same[0])
	}

	c := newCache(cacheShards) // one entry per shard
	held := c.acquire(nil, []byte("chat/held"))
	busy := c.acquire(nil, []byte("chat/busy"))
	busy.dirs[0].places = 1
	busy.Release()
	for i := range 10 * cacheShards {
		c.acquire(nil, []byte("chat/filler"+strconv.Itoa(i))).Release()
	}
	for _, want := range []*mailbox{held, busy} {
		if got := c.lookup([]byte(want.name)); got != want {
			t.Fatalf("%s was evicted while held or busy", want.name)
		} else {
			got.Release()
		}
	}
	held.Release()
	busy.dirs[0].places = 0
	if n := c.len(); n > cacheShards+2 {
		t.Fatalf("%d entries, bound %d (+2 held)", n, cacheShards)
	}
}

// TestLoadedMailboxBytes measures what one mailbox in memory costs (both
// directions loaded, its envelope bucket), the figure DefaultMaxLoaded's
// comment quotes; it fails if an entry grows past 1 KiB.
func TestLoadedMailboxBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	c := newCache(1 << 20)
	set, err := bucket.NewSet(bucket.Config{Burst: 120, Interval: time.Second / 2})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		m := c.acquire(nil, []byte("chat/AAECAwQFBgcICQoLDA"+strconv.Itoa(1000000+i)))
		m.loaded, m.exists = true, true
		m.dirs[0].loaded, m.dirs[1].loaded = true, true
		set.Take(m.key, 1)
		m.Release()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per mailbox in memory", per)
	if per > 1024 {
		t.Fatalf("%.0f bytes per mailbox in memory, want at most 1 KiB", per)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(set)
}
