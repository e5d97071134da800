package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeDisk is a filesystem whose free space the test sets.
type fakeDisk struct{ free atomic.Uint64 }

func (f *fakeDisk) freeBytes(string) (uint64, error) { return f.free.Load(), nil }

func openGuarded(t *testing.T, reserve uint64, disk *fakeDisk) (*DB, string) {
	t.Helper()
	dir := t.TempDir()
	db, err := OpenOptions(dir, nil, Options{DiskReserve: reserve, freeBytes: disk.freeBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, dir
}

func put(db *DB, key string, n int) error {
	b := db.NewBatch()
	if err := b.Set([]byte(key), make([]byte, n)); err != nil {
		return err
	}
	return db.Commit(b)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDiskReserveRefusesWritesAndRecovers(t *testing.T) {
	const reserve = 1 << 20
	disk := &fakeDisk{}
	disk.free.Store(reserve) // exactly the reserve: still writable
	db, _ := openGuarded(t, reserve, disk)
	if err := put(db, "a", 10); err != nil {
		t.Fatalf("write at the reserve: %v", err)
	}
	disk.free.Store(reserve - 1) // one byte below
	waitFor(t, "refusal", func() bool { return db.Unavailable() != nil })
	err := put(db, "b", 10)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write below the reserve: %v, want ErrUnavailable", err)
	}
	if _, err := db.Get([]byte("b")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refused write stored something: %v", err)
	}
	if v, err := db.Get([]byte("a")); err != nil || len(v) != 10 {
		t.Fatalf("read while refusing writes: %v", err)
	}
	disk.free.Store(4 * reserve)
	waitFor(t, "recovery", func() bool { return db.Unavailable() == nil })
	if err := put(db, "c", 10); err != nil {
		t.Fatalf("write after space came back: %v", err)
	}
}

// Our own writes spend the headroom measured last: past it the next write
// is refused before the monitor measures again.
func TestDiskReserveCountsOwnWrites(t *testing.T) {
	const reserve = 1 << 20
	disk := &fakeDisk{}
	disk.free.Store(reserve + 100<<10) // 100 KiB above the reserve
	db, _ := openGuarded(t, reserve, disk)
	db.health.stopMonitorForTest(t)
	db.health.check(time.Now())
	for i := range 2 { // 2 x 50 KiB values: the headroom, to the byte or so
		if err := put(db, string(rune('a'+i)), 50<<10-20); err != nil {
			t.Fatalf("write %d within the headroom: %v", i, err)
		}
	}
	if err := put(db, "x", 1<<10); err != nil {
		t.Fatalf("write at the edge of the headroom: %v", err)
	}
	if err := put(db, "y", 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write past the headroom: %v, want ErrUnavailable", err)
	}
}

func TestPebbleFatalMarksStoreFailed(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := put(db, "a", 3); err != nil {
		t.Fatal(err)
	}
	// What Pebble does on a failed WAL write: Fatalf, then carry on.
	pebbleLogger{log: db.health.log, health: db.health}.Fatalf("pebble: fatal commit error: %v", "no space left on device")
	if err := put(db, "b", 3); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write after a fatal error: %v", err)
	}
	if db.Unavailable() == nil {
		t.Fatal("store reports itself writable after a fatal error")
	}
	db.health.stopMonitorForTest(t)
	db.health.check(time.Now())
	if db.Unavailable() == nil {
		t.Fatal("a fatal error cleared itself")
	}
	if v, err := db.Get([]byte("a")); err != nil || len(v) != 3 {
		t.Fatalf("read after a fatal error: %v", err)
	}
}

func TestStallAndNoProgressRefuseWrites(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h := db.health
	h.stopMonitorForTest(t)
	now := time.Now()

	h.stall.Store(now.Add(-stallLimit + 100*time.Millisecond).UnixNano())
	h.check(now)
	if db.Unavailable() != nil {
		t.Fatal("a stall shorter than the limit refuses writes")
	}
	h.stall.Store(now.Add(-stallLimit - time.Millisecond).UnixNano())
	h.check(now)
	if err := put(db, "a", 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write during a long stall: %v", err)
	}
	h.stall.Store(0)
	h.check(now)
	if err := put(db, "a", 1); err != nil {
		t.Fatalf("write after the stall: %v", err)
	}

	h.inflight.Add(1) // a commit that does not come back
	h.check(now)      // notes how many commits finished so far
	h.check(now)      // none since: the clock starts
	h.check(now.Add(stuckAfter))
	if db.Unavailable() != nil {
		t.Fatal("refused at the no-progress limit")
	}
	h.check(now.Add(stuckAfter + time.Millisecond))
	if !errors.Is(db.Unavailable(), ErrUnavailable) {
		t.Fatal("commits without progress past the limit do not refuse writes")
	}
	h.finished.Add(1) // progress
	h.check(now.Add(stuckAfter + 2*time.Millisecond))
	if db.Unavailable() != nil {
		t.Fatalf("still refused after progress: %v", db.Unavailable())
	}
	h.inflight.Add(-1)
}

func TestBallastReleasedWhenDiskFillsAndTakenBack(t *testing.T) {
	const reserve = 1 << 20
	disk := &fakeDisk{}
	disk.free.Store(3 * reserve)
	db, dir := openGuarded(t, reserve, disk)
	h := db.health
	path := filepath.Join(dir, ballastFile)
	held := func() bool {
		fi, err := os.Stat(path)
		return err == nil && fi.Size() == reserve/2
	}
	waitFor(t, "the ballast", held) // the monitor's first check takes it
	h.stopMonitorForTest(t)
	disk.free.Store(reserve / 4) // below the reserve, at a quarter of it: kept
	h.check(time.Now())
	if db.Unavailable() == nil || !held() {
		t.Fatalf("at a quarter of the reserve: refusal %v, ballast %v; want refused, kept", db.Unavailable(), held())
	}
	disk.free.Store(reserve/4 - 1)
	h.check(time.Now())
	if held() {
		t.Fatal("ballast kept below a quarter of the reserve")
	}
	disk.free.Store(reserve + reserve/2 - 1) // one byte short of reserve + ballast
	h.check(time.Now())
	if db.Unavailable() != nil || held() {
		t.Fatalf("short of room for the ballast: refusal %v, ballast %v; want writable, none", db.Unavailable(), held())
	}
	disk.free.Store(reserve + reserve/2)
	h.check(time.Now())
	if !held() {
		t.Fatal("ballast not taken back with room for it")
	}
	// Pebble's ENOSPC releases it whatever the measure says.
	h.enospc.Store(true)
	h.check(time.Now())
	if held() {
		t.Fatal("ballast kept after Pebble saw ENOSPC")
	}
}

// stopMonitorForTest stops the monitor goroutine so that the test drives
// check itself.
func (h *health) stopMonitorForTest(t *testing.T) {
	t.Helper()
	close(h.stop)
	<-h.done
	h.stop = make(chan struct{})
	h.done = make(chan struct{})
	close(h.done)
}

// Pebble retries a failed flush at once and forever; repeated background
// errors are slowed down, and ENOSPC among them releases the ballast at
// the next check.
func TestRepeatedBackgroundErrorsBackOff(t *testing.T) {
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h := db.health
	enospc := fmt.Errorf("flush: write 000012.sst: %w", syscall.ENOSPC)
	begin := time.Now()
	h.backgroundError(enospc) // the first: no pause
	if d := time.Since(begin); d > backoffMax {
		t.Fatalf("first background error paused %v", d)
	}
	if !h.enospc.Load() {
		t.Fatal("ENOSPC not noted for the ballast")
	}
	begin = time.Now()
	for range 8 { // pauses of 2, 4, ... 256 ms, each at most backoffMax
		h.backgroundError(enospc)
	}
	want := (2 + 4 + 8 + 16 + 32 + 64 + 128) * time.Millisecond // and one of backoffMax
	if d := time.Since(begin); d < want+backoffMax {
		t.Fatalf("8 repeated background errors took %v, want at least %v", d, want+backoffMax)
	}
	h.bgMu.Lock()
	h.bgLast = time.Now().Add(-time.Second) // a quiet second: the back-off starts over
	h.bgMu.Unlock()
	begin = time.Now()
	h.backgroundError(errors.New("compaction: something else"))
	if d := time.Since(begin); d > backoffMax {
		t.Fatalf("background error after a quiet second paused %v", d)
	}
}
