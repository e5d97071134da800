package mailboxbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/valyala/fasthttp"

	"edgerelay/bench/abtest"
	"edgerelay/store"
)

// PutOptions shape ComparePut. Zero fields take the defaults noted.
type PutOptions struct {
	// Writers lists the concurrent writer counts to compare, each writing
	// its own mailbox (ours) or its own keys (Pebble). Default 1 and 64.
	Writers []int
	// Rounds per side and writer count; the first warms up and is not
	// counted, so at least 2. Default 6.
	Rounds int
	// RoundTime is how long one side writes in one round. Default 1 s.
	RoundTime time.Duration
	// EnvelopeSize is the bytes of each envelope, and of each raw value.
	// Default 1024.
	EnvelopeSize int
	// DataDir is where both Pebble stores go, side by side on one disk; a
	// temporary directory (removed afterwards) when empty.
	DataDir string
	// Progress, when not nil, gets one line per measurement.
	Progress io.Writer
}

func (o PutOptions) withDefaults() (PutOptions, error) {
	if len(o.Writers) == 0 {
		o.Writers = []int{1, 64}
	}
	if o.Rounds == 0 {
		o.Rounds = 6
	}
	if o.RoundTime == 0 {
		o.RoundTime = time.Second
	}
	if o.EnvelopeSize == 0 {
		o.EnvelopeSize = 1024
	}
	switch {
	case o.Rounds < 2:
		return o, fmt.Errorf("mailboxbench: Rounds %d: need at least 2 (the first is dropped)", o.Rounds)
	case o.EnvelopeSize < 25 || o.EnvelopeSize > 65536:
		return o, fmt.Errorf("mailboxbench: EnvelopeSize %d is not an envelope's (25 to 65,536 bytes)", o.EnvelopeSize)
	}
	for _, w := range o.Writers {
		if w < 1 {
			return o, fmt.Errorf("mailboxbench: %d writers", w)
		}
	}
	return o, nil
}

// PutFigure is one writer count's outcome.
type PutFigure struct {
	Writers int
	// Ours and Pebble hold the synced writes per second of each counted
	// round; the medians are theirs.
	Ours, Pebble             []float64
	OursMedian, PebbleMedian float64
	// Ratio is OursMedian / PebbleMedian: the share of the raw synced
	// commit rate that survives the request path. RoundRatio is the
	// median of the per-round ratios.
	Ratio, RoundRatio float64
}

// PutReport is the outcome of ComparePut.
type PutReport struct {
	Options PutOptions // defaults filled in
	Figures []PutFigure
}

// ComparePut measures envelope PUTs through our handler over loopback HTTP
// beside raw Pebble commits on the same disk, for each writer count.
//
// Ours: each writer PUTs envelopes of EnvelopeSize bytes with rising
// sequences into its own mailbox over a keep-alive connection; each 201
// means the envelope (and the mailbox's last-active time) was synced. The
// baseline: each writer applies a Pebble batch holding one Set of a key of
// the same length as our envelope key and a value of the same size, with
// pebble.Sync, to a database opened with Pebble's default options (the
// store's differ only in a larger block cache, which reads use and these
// writes do not). That is the ceiling any envelope write can reach on this disk, group
// commit included; the ratio is the share of it ours keeps.
func ComparePut(ctx context.Context, o PutOptions) (rep PutReport, err error) {
	o, err = o.withDefaults()
	if err != nil {
		return PutReport{}, err
	}
	dir := o.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "mailboxbench-put-"); err != nil {
			return PutReport{}, err
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	}
	rig, err := newPutRig(dir, slices.Max(o.Writers), o.EnvelopeSize)
	if err != nil {
		return PutReport{}, err
	}
	defer func() { err = errors.Join(err, rig.close()) }()

	rep.Options = o
	for _, writers := range o.Writers {
		runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) (float64, error) {
			runtime.GC()
			rate, err := load(ctx, o.RoundTime, writers, func(w int) func() error { return rig.op(side, w) })
			if err != nil {
				return 0, fmt.Errorf("mailboxbench: PUT, %d writers, round %d, %s: %w", writers, round, putSides[side], err)
			}
			progress(o.Progress, round, fmt.Sprintf("PUT %2d writers %-8s", writers, putSides[side]), rate, "writes/s")
			return rate, nil
		})
		if err != nil {
			return PutReport{}, err
		}
		f := PutFigure{Writers: writers, Ours: runs[0], Pebble: runs[1],
			OursMedian: abtest.Median(runs[0]), PebbleMedian: abtest.Median(runs[1])}
		f.Ratio = f.OursMedian / f.PebbleMedian
		f.RoundRatio = abtest.RoundRatio(f.Ours, f.Pebble)
		rep.Figures = append(rep.Figures, f)
	}
	return rep, nil
}

// The two sides of the PUT comparison, by index.
var putSides = [2]string{"ours", "pebble"}

// putRig is the PUT comparison's set-up: our relay over a store, and a
// raw Pebble database beside it, with up to writers mailboxes claimed.
type putRig struct {
	db     *store.DB
	raw    *pebble.DB
	ours   *relay
	client *fasthttp.HostClient
	size   int
	// next and rawNext are each writer's last sequence written. They go
	// on rising across rounds: a writer owns one mailbox (or one key
	// range) for the rig's whole life.
	next, rawNext []uint64
}

func newPutRig(dir string, writers, size int) (rig *putRig, err error) {
	rig = &putRig{size: size, next: make([]uint64, writers), rawNext: make([]uint64, writers)}
	defer func() {
		if err != nil {
			err = errors.Join(err, rig.close())
		}
	}()
	if rig.db, err = store.Open(filepath.Join(dir, "ours"), nil); err != nil {
		return rig, err
	}
	if rig.raw, err = pebble.Open(filepath.Join(dir, "raw"), &pebble.Options{Logger: quietPebble{}}); err != nil {
		return rig, err
	}
	log := store.NewEnvelopeLog(rig.db)
	clock := newStepClock()
	if err := seed(log, clock.Now, writers, 0, 0); err != nil {
		return rig, err
	}
	if rig.ours, _, err = startOurs(loopback, log, clock.Now, 0); err != nil {
		return rig, err
	}
	rig.client = newClient(rig.ours.addr, writers)
	return rig, nil
}

func (r *putRig) close() error {
	var err error
	if r.client != nil {
		r.client.CloseIdleConnections()
	}
	if r.ours != nil {
		err = r.ours.close()
	}
	if r.raw != nil {
		err = errors.Join(err, r.raw.Close())
	}
	if r.db != nil {
		err = errors.Join(err, r.db.Close())
	}
	return err
}

// op is writer w's next write on one side: 0 ours, 1 raw Pebble.
func (r *putRig) op(side, w int) func() error {
	if side == 0 {
		return putOp(r.client, w, &r.next[w], r.size)
	}
	return rawOp(r.raw, w, &r.rawNext[w], r.size)
}

// putOp is one writer's PUT of the next envelope of its mailbox.
func putOp(client *fasthttp.HostClient, w int, next *uint64, size int) func() error {
	var req fasthttp.Request
	var resp fasthttp.Response
	req.Header.SetMethod(fasthttp.MethodPut)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.SetContentType("application/octet-stream")
	prefix := "http://" + client.Addr + mailboxPath(w) + "/p2c/"
	var uri, env []byte
	return func() error {
		seq := *next + 1
		env = envelope(env, seq, size)
		uri = strconv.AppendUint(append(uri[:0], prefix...), seq, 10)
		req.SetRequestURIBytes(uri)
		req.SetBodyRaw(env)
		if err := client.Do(&req, &resp); err != nil {
			return err
		}
		if resp.StatusCode() != fasthttp.StatusCreated {
			return fmt.Errorf("PUT %s: %d %s", uri, resp.StatusCode(), resp.Body())
		}
		*next = seq
		return nil
	}
}

// rawOp is one writer's synced commit of a batch with one Set: the key
// is what our envelope key would be in mailbox w (same length), the value
// an envelope of the same size.
func rawOp(db *pebble.DB, w int, next *uint64, size int) func() error {
	commit := rawCommit(db, w, next)
	var env []byte
	return func() error {
		env = envelope(env, *next+1, size)
		return commit(env)
	}
}

// rawCommit commits env as writer w's next envelope: one Set in a batch
// applied with pebble.Sync, the key our envelope key would be in mailbox
// w.
func rawCommit(db *pebble.DB, w int, next *uint64) func(env []byte) error {
	name := mailboxName(w)
	var key []byte
	return func(env []byte) error {
		*next++
		key = store.EnvelopeKey(key[:0], name, store.DirP2C, *next)
		b := db.NewBatch()
		if err := b.Set(key, env, nil); err != nil {
			_ = b.Close()
			return err
		}
		err := db.Apply(b, pebble.Sync)
		return errors.Join(err, b.Close())
	}
}

// quietPebble keeps Pebble's informational chatter off the report, like
// the store's own logger does (it logs at debug level).
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)         {}
func (quietPebble) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, "pebble: "+f+"\n", args...) }
func (quietPebble) Fatalf(f string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+f+"\n", args...)
	os.Exit(1)
}

// progress writes one measurement line.
func progress(w io.Writer, round int, what string, v float64, unit string) {
	if w == nil {
		return
	}
	note := ""
	if round == 0 {
		note = "  (warm-up, not counted)"
	}
	fmt.Fprintf(w, "round %d %s %10.0f %s%s\n", round, what, v, unit, note)
}
