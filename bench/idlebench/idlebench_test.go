package idlebench

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/fastpath/netlimit"
)

// The tests are short versions of the figures (a few hundred sockets,
// one round): they fail when a figure is not produced, a socket is lost or
// does not park, or the storm's contract breaks. Each starts two to eight
// server processes; -short skips those over TLS.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// idleserve builds the server program once per test binary run.
func idleserve(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if binDir, buildErr = os.MkdirTemp("", "idlebench-test-"); buildErr == nil {
			binPath, buildErr = Build(ctx, ".", binDir)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// checkMemory says what is wrong with a figure of n sockets a side: a
// round missing, a socket that did not park or kept its goroutine
// parked, one without its reader unparked, a growth that cannot be a
// measurement.
func checkMemory(t *testing.T, f MemoryFigure, n int) {
	t.Helper()
	if len(f.Parked) != 1 || len(f.Unparked) != 1 {
		t.Fatalf("%s: %d and %d rounds, want 1 each", f.Name(), len(f.Parked), len(f.Unparked))
	}
	p, u := f.Parked[0], f.Unparked[0]
	for side, r := range [2]IdleRound{p, u} {
		if r.Sockets != n || r.Held != n+f.Controls {
			t.Errorf("%s %s: %d sockets, %d held, want %d and %d", f.Name(), Sides[side], r.Sockets, r.Held, n, n+f.Controls)
		}
		if r.PerSocket < 256 || r.PerSocket > 256<<10 {
			t.Errorf("%s %s: %.0f bytes per socket: not a plausible measurement", f.Name(), Sides[side], r.PerSocket)
		}
	}
	// Parked, nothing holds a goroutine but fasthttp's idle workers of
	// the upgrades (they linger for seconds; 32 of them over 300 sockets
	// were seen).
	if p.Parked != p.Held || p.GoroutinesPerSocket > 0.25 {
		t.Errorf("%s parked: %d of %d parked, %.2f goroutines per socket", f.Name(), p.Parked, p.Held, p.GoroutinesPerSocket)
	}
	// Unparked, a reader each (and a writer while one is queued: the
	// phones' opens, the signal sides' "peer 1"), and the idle workers.
	if u.Parked != 0 || u.GoroutinesPerSocket < 0.9 || u.GoroutinesPerSocket > 2.25 {
		t.Errorf("%s unparked: %d parked, %.2f goroutines per socket", f.Name(), u.Parked, u.GoroutinesPerSocket)
	}
	if f.Ratio != f.ParkedMedian/f.UnparkedMedian || f.ParkedMedian != p.PerSocket {
		t.Errorf("%s: ratio %v of %v and %v", f.Name(), f.Ratio, f.ParkedMedian, f.UnparkedMedian)
	}
}

// logged logs a measurement's progress and its report's text, and ends
// the test at once if the measurement failed.
func logged(t *testing.T, progress fmt.Stringer, rep interface{ WriteText(io.Writer) }, err error) {
	t.Helper()
	t.Logf("\n%s", progress)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	rep.WriteText(&text)
	t.Logf("\n%s", text.String())
}

// onePerSide is the one round of each side, parked first; anything else
// ends the test.
func onePerSide[R any](t *testing.T, parked, unparked []R) [2]R {
	t.Helper()
	if len(parked) != 1 || len(unparked) != 1 {
		t.Fatalf("%d and %d rounds, want 1 each", len(parked), len(unparked))
	}
	return [2]R{parked[0], unparked[0]}
}

func measureSmall(t *testing.T, n int, plainOnly bool, kinds ...Kind) MemoryReport {
	t.Helper()
	bin := idleserve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	profiles := t.TempDir()
	rep, err := MeasureMemory(ctx, MemoryOptions{Binary: bin, Sockets: n, Rounds: 1, Kinds: kinds, PlainOnly: plainOnly,
		ProfileDir: profiles, Progress: &out})
	logged(t, &out, rep, err)
	if rep.Capped || rep.Options.Sockets != n {
		t.Errorf("%d sockets asked, %d measured, capped %v", n, rep.Options.Sockets, rep.Capped)
	}
	for _, f := range rep.Figures {
		for _, side := range Sides {
			name := "idle-" + kindFile(f.Kind, f.TLS) + "-" + side + "-0.pprof"
			if fi, err := os.Stat(profiles + "/" + name); err != nil || fi.Size() == 0 {
				t.Errorf("no heap profile %s: %v", name, err)
			}
		}
	}
	return rep
}

// Every kind, plain: parked, each socket gives its goroutine back.
func TestMemoryPlain(t *testing.T) {
	const n = 300
	rep := measureSmall(t, n, true, Kinds...)
	if len(rep.Figures) != len(Kinds) {
		t.Fatalf("%d figures, want %d", len(rep.Figures), len(Kinds))
	}
	for i, f := range rep.Figures {
		if f.Kind != Kinds[i] || f.TLS {
			t.Errorf("figure %d is %s, want %s plain", i, f.Name(), Kinds[i])
		}
		checkMemory(t, f, n)
	}
}

// Over TLS, the sockets park too.
func TestMemoryTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts eight server processes and makes 2,400 TLS handshakes")
	}
	const n = 300
	rep := measureSmall(t, n, false, Watch, Phone)
	if len(rep.Figures) != 4 {
		t.Fatalf("%d figures, want 4", len(rep.Figures))
	}
	for _, f := range rep.Figures {
		checkMemory(t, f, n)
	}
}

// The connections of the accept path: parked, one that has sent nothing
// holds no goroutine; a keep-alive connection after its request holds
// fasthttp's (nothing parks it); each is judged against the parked watch
// socket of the same run.
func TestMemoryAccept(t *testing.T) {
	// A parked connection that has sent nothing is about a kilobyte: 500
	// of them keep its growth well above the resident set's noise.
	const n = 500
	rep := measureSmall(t, n, true, Watch, Silent, KeepAlive)
	if len(rep.Figures) != 3 {
		t.Fatalf("%d figures, want 3", len(rep.Figures))
	}
	watch := rep.Figures[0]
	for _, f := range rep.Figures[1:] {
		p, u := f.Parked[0], f.Unparked[0]
		for side, r := range [2]IdleRound{p, u} {
			if r.Sockets != n || r.Held != n || r.PerSocket <= 0 || r.PerSocket > 256<<10 {
				t.Errorf("%s %s: %d sockets, %d held, %.0f bytes each", f.Name(), Sides[side], r.Sockets, r.Held, r.PerSocket)
			}
		}
		if u.GoroutinesPerSocket < 0.9 || u.GoroutinesPerSocket > 2.25 {
			t.Errorf("%s unparked: %.2f goroutines per connection", f.Name(), u.GoroutinesPerSocket)
		}
		if f.Kind == Silent && p.GoroutinesPerSocket > 0.25 {
			t.Errorf("%s parked: %.2f goroutines per connection", f.Name(), p.GoroutinesPerSocket)
		}
		if f.GoalBytes != watch.ParkedMedian || !strings.Contains(f.GoalText, "WebSocket") {
			t.Errorf("%s: goal %v %q, want the parked watch socket's %v", f.Name(), f.GoalBytes, f.GoalText, watch.ParkedMedian)
		}
	}
	if watch.GoalBytes != GoalPlainBytes {
		t.Errorf("watch goal %v", watch.GoalBytes)
	}
}

func TestWake(t *testing.T) {
	bin := idleserve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	const n, deliveries = 200, 600
	rep, err := MeasureWake(ctx, WakeOptions{Binary: bin, Sockets: n, Deliveries: deliveries, Rounds: 1, Progress: &out})
	logged(t, &out, rep, err)
	for side, r := range onePerSide(t, rep.Parked, rep.Unparked) {
		if r.Deliveries != deliveries || r.P50 <= 0 || r.P99 < r.P50 || r.CPUPerDelivery <= 0 ||
			r.Pings != deliveries || r.PingP50 <= 0 || r.PingP99 < r.PingP50 || r.CPUPerPing <= 0 ||
			r.Keepalives != deliveries || r.KeepaliveP50 <= 0 || r.KeepaliveP99 < r.KeepaliveP50 || r.CPUPerKeepalive <= 0 {
			t.Errorf("%s: %+v", Sides[side], r)
		}
	}
	if rep.Parked[0].Parked != n || rep.Unparked[0].Parked != 0 {
		t.Errorf("%d and %d sockets parked before the deliveries, want %d and 0", rep.Parked[0].Parked, rep.Unparked[0].Parked, n)
	}
	if rep.AddedP99 != rep.ParkedP99-rep.UnparkedP99 || rep.ParkedP99 != rep.Parked[0].P99 {
		t.Errorf("added p99 %v of %v and %v", rep.AddedP99, rep.ParkedP99, rep.UnparkedP99)
	}
}

// A storm of 500 sockets against a bucket of 200 refilled at 500 a
// second: a few hundred refusals, all the rate's, and every client back.
func TestStorm(t *testing.T) {
	bin := idleserve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	const n = 500
	o := StormOptions{Binary: bin, Sockets: n, Limits: netlimit.Limits{AcceptRate: 500, AcceptBurst: 200}, Progress: &out}
	rep, err := MeasureStorm(ctx, o)
	logged(t, &out, rep, err)
	for side, r := range onePerSide(t, rep.Parked, rep.Unparked) {
		if err := rep.Options.Check(r); err != nil {
			t.Errorf("%s: %v", Sides[side], err)
		}
		// The bucket holds 200 of the 500: the rest wait for the rate,
		// so some clients were refused and tried again.
		if r.Refused.Rate == 0 || r.Attempts <= n || r.Floor != 600*time.Millisecond {
			t.Errorf("%s: %d rate refusals, %d attempts, floor %v", Sides[side], r.Refused.Rate, r.Attempts, r.Floor)
		}
		if r.Refused.Open < n {
			t.Errorf("%s: the listeners hold %d connections, want at least %d", Sides[side], r.Refused.Open, n)
		}
	}
	if rep.Parked[0].Parked != n {
		t.Errorf("%d of %d reconnected sockets parked", rep.Parked[0].Parked, n)
	}
}

// Check catches each way a storm can break its contract.
func TestStormCheck(t *testing.T) {
	o, err := StormOptions{Binary: "x", Sockets: 1000, Limits: netlimit.Limits{AcceptRate: 100, AcceptBurst: 500}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	good := StormRound{Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1300, Refused: Refusals{Rate: 300}}
	if err := o.Check(good); err != nil {
		t.Fatalf("a good storm: %v", err)
	}
	for name, r := range map[string]StormRound{
		"a refusal for the total":  {Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1301, Refused: Refusals{Rate: 300, Total: 1}},
		"a refusal per IP":         {Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1301, Refused: Refusals{Rate: 300, PerIP: 1}},
		"out of descriptors":       {Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1301, Refused: Refusals{Rate: 300, FDs: 1}},
		"a socket lost":            {Sockets: 999, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1300, Refused: Refusals{Rate: 300}},
		"faster than the rate":     {Sockets: 1000, Reconnect: time.Second, Floor: 5 * time.Second, Attempts: 1300, Refused: Refusals{Rate: 300}},
		"refusals never attempted": {Sockets: 1000, Reconnect: 5 * time.Second, Floor: 5 * time.Second, Attempts: 1100, Refused: Refusals{Rate: 300}},
	} {
		if err := o.Check(r); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// More sockets than the open-file limit holds are capped, and said so.
func TestCapSockets(t *testing.T) {
	if n, capped := capSockets(10_000, 20_000); n != 10_000 || capped {
		t.Errorf("10,000 under a limit of 20,000: %d, capped %v", n, capped)
	}
	n, capped := capSockets(100_000, 20_000)
	if !capped || n != 18_000 {
		t.Errorf("100,000 under a limit of 20,000: %d, capped %v; want 18,000 (phones' control sockets and headroom)", n, capped)
	}
	rep := MemoryReport{Requested: 100_000, FileLimit: 20_000, Capped: true, Options: MemoryOptions{Sockets: n}}
	if note := rep.CapNote(); !strings.Contains(note, "CAPPED") || !strings.Contains(note, "100000") || !strings.Contains(note, "18000") {
		t.Errorf("cap note %q", note)
	}
}

func TestRefusesBadOptions(t *testing.T) {
	ctx := context.Background()
	if _, err := MeasureMemory(ctx, MemoryOptions{}); err == nil {
		t.Error("memory without a binary")
	}
	if _, err := MeasureMemory(ctx, MemoryOptions{Binary: "x", Kinds: []Kind{"nonsense"}}); err == nil {
		t.Error("memory of an unknown kind")
	}
	if _, err := MeasureWake(ctx, WakeOptions{Binary: "x", EnvelopeSize: 24}); err == nil {
		t.Error("wake with envelopes under 25 bytes")
	}
	if _, err := MeasureStorm(ctx, StormOptions{Binary: "x", Sockets: 1}); err == nil {
		t.Error("a storm of one socket")
	}
	if _, err := MeasureStorm(ctx, StormOptions{Binary: "x", Limits: netlimit.Limits{AcceptBurst: -1}}); err == nil {
		t.Error("a storm with a negative burst")
	}
	if err := (Layout{Kind: Watch, Sockets: 10, PerDirection: 9}).check(); err == nil {
		t.Error("nine watches on a direction")
	}
}
