package pushbench

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Every write wakes its mailbox's device exactly once, with the spec's
// alert, and the fake accepts every push: the benchmark counts real,
// verified deliveries.
func TestEveryWritePushes(t *testing.T) {
	r := NewRig(t, Options{Mailboxes: 8, Writers: 4})
	if err := r.Write(24); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitSent(24, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	got := r.APNs.Requests()
	if len(got) != 24 {
		t.Fatalf("the fake received %d pushes, want 24", len(got))
	}
	perDevice := map[string]int{}
	for _, q := range got {
		if q.Problem != "" || q.Status != 200 {
			t.Fatalf("the fake refused a push: %s (%d %s)", q.Problem, q.Status, q.Reason)
		}
		if q.Header.Get("apns-push-type") != "alert" || q.Header.Get("apns-topic") != topic {
			t.Fatalf("push headers %v", q.Header)
		}
		perDevice[q.DeviceToken]++
	}
	for i := range 8 {
		device := fmt.Sprintf("%064x", i+1)
		if perDevice[device] != 3 {
			t.Errorf("device of mailbox %d woken %d times, want 3", i, perDevice[device])
		}
	}
	p, err := r.Pushes()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 {
		t.Errorf("push outcomes %v, want only sent", p)
	}
}

// BenchmarkPushFanout writes envelopes with X-Relay-Notify: alert through
// the real handler, each waking a registered device through the fake
// APNs, and counts the pushes the fake accepted. An op is one write and
// its push; besides ns/op and allocs/op (whole process: writers' client,
// relay, HTTP/2 provider client and the fake) it reports pushes/s (wall
// clock), pushes/cpu-s (pushes per second of one core's CPU time, all of
// the process's work included) and skipped/op (pushes the relay dropped
// for a full queue or a bucket: none is expected, and the per-core
// figure is only the push path's when there are none).
func BenchmarkPushFanout(b *testing.B) {
	r := NewRig(b, Options{})
	// Warm-up: every direction loaded, the HTTP/2 connection open, the
	// provider token minted and verified.
	if err := r.Write(r.o.Mailboxes); err != nil {
		b.Fatal(err)
	}
	if err := r.WaitSent(r.o.Mailboxes, 30*time.Second); err != nil {
		b.Fatal(err)
	}
	before, err := r.Pushes()
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	b.ReportAllocs()
	cpu0, wall0 := CPUTime(), time.Now()
	b.ResetTimer()
	if err := r.Write(b.N); err != nil {
		b.Fatal(err)
	}
	// Skips are decided while a write is answered, so they are final now.
	mid, err := r.Pushes()
	if err != nil {
		b.Fatal(err)
	}
	skipped := 0.0
	for _, outcome := range []string{"queue_full", "rate_limited", "foreground"} {
		skipped += mid[outcome] - before[outcome]
	}
	if err := r.WaitSent(int(before["sent"])+b.N-int(skipped), time.Minute); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cpu, wall := CPUTime()-cpu0, time.Since(wall0)
	after, err := r.Pushes()
	if err != nil {
		b.Fatal(err)
	}
	sent := after["sent"] - before["sent"]
	b.ReportMetric(sent/wall.Seconds(), "pushes/s")
	b.ReportMetric(sent/cpu.Seconds(), "pushes/cpu-s")
	b.ReportMetric(skipped/float64(b.N), "skipped/op")
	if n := len(r.APNs.Requests()); n != int(after["sent"]) {
		b.Fatalf("the fake received %d pushes, the relay counted %v sent", n, after["sent"])
	}
}
