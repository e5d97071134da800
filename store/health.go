package store

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// ErrUnavailable is returned by every write while the store refuses
// writes: free space in the data dir is below the reserve, Pebble stalls
// or does not finish commits, or Pebble failed (until a restart). The
// write was not made. Reads go on being served. Services answer it with
// 503 and Retry-After (RetryAfter seconds).
var ErrUnavailable = errors.New("store: storage unavailable")

// RetryAfter is the Retry-After header value (seconds) that services send
// with the 503 of ErrUnavailable: free space comes back on the scale of an
// operator's action, not of a retry loop.
const RetryAfter = "5"

// How the store watches its health. One goroutine per DB checks every
// healthTick (and at once when a write finds its headroom spent), so that
// the write path reads two atomics and makes no system call.
const (
	healthTick = 100 * time.Millisecond
	// stallLimit: a Pebble write stall (memtables or L0 files waiting
	// for flushes and compactions) longer than this refuses new writes
	// until it ends; shorter stalls are the ordinary back-pressure of a
	// write burst.
	stallLimit = 2 * time.Second
	// stuckAfter: commits in flight and none finished for this long
	// refuse new writes, so that requests are answered instead of
	// queueing behind a store that does not make progress.
	stuckAfter = 2 * time.Second
	// backoffMax bounds the pause after a repeated background error.
	backoffMax = 250 * time.Millisecond
)

// Reasons for refusing writes, from most to least severe.
var (
	errLowSpace = fmt.Errorf("%w: free space in the data dir is below the reserve (RELAY_DISK_RESERVE)", ErrUnavailable)
	errStalled  = fmt.Errorf("%w: Pebble write stall for more than %s", ErrUnavailable, stallLimit)
	errStuck    = fmt.Errorf("%w: commits in flight and none finished for %s", ErrUnavailable, stuckAfter)
)

// health decides whether the store takes writes. The write path calls
// admit before and committed after each commit; the monitor goroutine
// (run) does the slow checks and publishes its verdict in refusal.
type health struct {
	dir     string // the Pebble dir, whose filesystem is measured
	reserve uint64 // 0: no free-space guard
	ballast *ballast
	log     *slog.Logger
	// freeBytes measures the free space of dir (a fake in tests).
	freeBytes func(dir string) (uint64, error)

	refusal  atomic.Pointer[error] // nil while writable
	failed   atomic.Pointer[error] // Pebble's fatal error, until restart
	headroom atomic.Int64          // bytes that may be committed before the next measure
	written  atomic.Int64          // bytes committed since the last measure
	inflight atomic.Int64          // commits inside Pebble
	finished atomic.Uint64         // commits that came back from Pebble
	stall    atomic.Int64          // unix ns of the write stall's start, 0 when none
	enospc   atomic.Bool           // Pebble saw ENOSPC since the last check

	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	// Only the monitor goroutine touches these (and Open, before it runs).
	running      bool // the monitor runs: the ballast may be written
	lastFinished uint64
	noProgress   time.Time
	free         uint64
	shown        error // the refusal last logged

	// The background-error back-off, under its own lock (Pebble calls
	// BackgroundError from its flush and compaction goroutines).
	bgMu     sync.Mutex
	bgLast   time.Time
	bgRepeat int
}

func newHealth(dir string, reserve uint64, b *ballast, log *slog.Logger) *health {
	h := &health{
		dir: dir, reserve: reserve, ballast: b, log: log, freeBytes: freeBytes,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	h.headroom.Store(math.MaxInt64)
	return h
}

// admit returns nil when a write may go to Pebble, else why not.
func (h *health) admit() error {
	if e := h.refusal.Load(); e != nil {
		return *e
	}
	// failed is read too: a check that began before Pebble failed may
	// publish its older verdict after fail did.
	if f := h.failed.Load(); f != nil {
		return *f
	}
	if h.written.Load() > h.headroom.Load() {
		// Our own writes spent what was free above the reserve since the
		// last measure: refuse, and measure again now.
		h.nudge()
		return errLowSpace
	}
	h.inflight.Add(1)
	return nil
}

// committed records a commit's return from Pebble, with its size when it
// succeeded. It reports the store's fatal error when Pebble failed while
// this commit was in flight: Pebble's Apply returns nil after calling the
// logger's Fatalf, so a nil from Apply alone does not mean durable.
func (h *health) committed(bytes int, err error) error {
	h.inflight.Add(-1)
	h.finished.Add(1)
	if f := h.failed.Load(); f != nil {
		return *f
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			h.enospc.Store(true)
			h.nudge()
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	h.written.Add(int64(bytes))
	return nil
}

// fail marks the store failed for good (Pebble's Fatalf): writes are
// refused at once and until a restart; reads are still tried.
func (h *health) fail(msg string) {
	err := fmt.Errorf("%w: Pebble failed (%s); writes are refused until the relay restarts", ErrUnavailable, msg)
	if h.failed.CompareAndSwap(nil, &err) {
		h.refusal.Store(&err)
		h.log.Error("pebble failed; writes refused until restart", "detail", msg)
	}
}

// unavailable is the current refusal, nil while the store takes writes.
func (h *health) unavailable() error {
	if e := h.refusal.Load(); e != nil {
		return *e
	}
	if f := h.failed.Load(); f != nil {
		return *f
	}
	return nil
}

func (h *health) nudge() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run is the monitor goroutine; it returns when stop is closed.
func (h *health) run() {
	defer close(h.done)
	t := time.NewTicker(healthTick)
	defer t.Stop()
	// Open measured already; writing the ballast (up to its size of
	// zeros where the filesystem cannot allocate) waits for this
	// goroutine, so that it does not delay the start.
	h.running = true
	h.check(time.Now())
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		case <-h.kick:
		}
		h.check(time.Now())
	}
}

// check measures free space, looks at stalls and progress, and publishes
// the verdict.
func (h *health) check(now time.Time) {
	var reason error
	if f := h.failed.Load(); f != nil {
		reason = *f
	}
	if h.stuck(now) && reason == nil {
		reason = errStuck
	}
	if s := h.stall.Load(); s != 0 && now.Sub(time.Unix(0, s)) > stallLimit && reason == nil {
		reason = errStalled
	}
	if h.reserve > 0 {
		if low := h.measure(); low && reason == nil {
			reason = errLowSpace
		}
	}
	if reason == nil {
		h.refusal.Store(nil)
	} else {
		h.refusal.Store(&reason)
	}
	if f := h.failed.Load(); f != nil {
		h.refusal.Store(f) // fail ran during this check: it stands
	}
	if reason != h.shown {
		var space []any // free space is measured only with a reserve
		if h.reserve > 0 {
			space = []any{"free", h.free, "reserve", h.reserve}
		}
		if reason != nil {
			h.log.Warn("store refuses writes", append([]any{"reason", reason.Error()}, space...)...)
		} else {
			h.log.Info("store takes writes again", space...)
		}
		h.shown = reason
	}
}

// stuck reports commits in flight with none finished for stuckAfter.
func (h *health) stuck(now time.Time) bool {
	fin := h.finished.Load()
	if h.inflight.Load() == 0 || fin != h.lastFinished {
		h.lastFinished, h.noProgress = fin, time.Time{}
		return false
	}
	if h.noProgress.IsZero() {
		h.noProgress = now
	}
	return now.Sub(h.noProgress) > stuckAfter
}

// measure reads the free space, releases or takes back the ballast, sets
// the headroom for the write path, and reports whether free space is
// below the reserve.
func (h *health) measure() (low bool) {
	h.written.Store(0)
	free, err := h.freeBytes(h.dir)
	if err != nil {
		// Unknown free space refuses nothing: the guard is a safety net,
		// not a dependency.
		h.headroom.Store(math.MaxInt64)
		return false
	}
	enospc := h.enospc.Swap(false)
	if h.ballast.held() && (free < h.reserve/4 || enospc) {
		// The disk is nearly full although writes are refused (another
		// process fills it), or Pebble already hit ENOSPC: give Pebble the
		// ballast's room to finish its flush and to close and reopen.
		if err := h.ballast.release(); err != nil {
			h.log.Error("ballast release failed", "err", err)
		} else {
			h.log.Warn("disk nearly full: ballast released", "path", h.ballast.path, "bytes", h.ballast.size, "free", free)
			if f, err := h.freeBytes(h.dir); err == nil {
				free = f
			}
		}
	} else if h.running && !h.ballast.held() && h.ballast.size > 0 && free >= h.reserve+h.ballast.size {
		if err := h.ballast.take(); err != nil {
			h.log.Warn("ballast not created", "path", h.ballast.path, "err", err)
		} else if f, err := h.freeBytes(h.dir); err == nil {
			free = f
		}
	}
	h.free = free
	h.headroom.Store(int64(free) - int64(h.reserve))
	return free < h.reserve
}

func freeBytes(dir string) (uint64, error) {
	u, err := vfs.Default.GetDiskUsage(dir)
	if err != nil {
		return 0, fmt.Errorf("store: free space of %s: %w", dir, err)
	}
	return u.AvailBytes, nil
}

// listener feeds Pebble's events into the health state and the log.
func (h *health) listener() *pebble.EventListener {
	return &pebble.EventListener{
		BackgroundError: h.backgroundError,
		WriteStallBegin: func(pebble.WriteStallBeginInfo) { h.stall.Store(time.Now().UnixNano()) },
		WriteStallEnd:   func() { h.stall.Store(0); h.nudge() },
		DiskSlow: func(i pebble.DiskSlowInfo) {
			h.log.Warn("disk slow", "op", i.OpType.String(), "duration", i.Duration.String())
		},
	}
}

// backgroundError logs a failed flush or compaction (one constant message,
// so that the log limiter sees repeats as one) and backs off when it
// repeats: Pebble retries a failed flush at once and forever (a TODO in
// its flush loop), which on a full disk is a busy loop of a core and a
// log line each turn. Pebble calls this on the goroutine that retries, so
// the pause slows the retries; it holds Pebble's DB mutex meanwhile,
// which reads do not take.
func (h *health) backgroundError(err error) {
	h.log.Error("pebble background error", "err", err)
	if errors.Is(err, syscall.ENOSPC) {
		h.enospc.Store(true)
		h.nudge()
	}
	h.bgMu.Lock()
	now := time.Now()
	if now.Sub(h.bgLast) > 2*backoffMax {
		h.bgRepeat = 0
	} else if h.bgRepeat < 8 {
		h.bgRepeat++
	}
	h.bgLast = now
	repeat := h.bgRepeat
	h.bgMu.Unlock()
	if repeat > 0 {
		time.Sleep(min(time.Duration(1<<repeat)*time.Millisecond, backoffMax))
	}
}
