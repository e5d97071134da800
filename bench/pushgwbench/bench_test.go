package pushgwbench

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestRigDelivers(t *testing.T) {
	r := NewRig(t, Options{Metered: true, Tokens: 3})
	var req fasthttp.Request
	var resp fasthttp.Response
	for range 6 {
		if err := r.Send(&req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	reqs := r.APNs.Requests()
	if len(reqs) != 6 {
		t.Fatalf("APNs received %d pushes, want 6", len(reqs))
	}
	for _, q := range reqs {
		if q.Problem != "" || q.Status != 200 {
			t.Fatalf("the fake refused a push: %s", q.Problem)
		}
	}
}

// BenchmarkSendAPNs is POST /send through the real handler to the fake
// APNs, with several concurrent senders. Besides ns/op and allocs/op
// (whole process: client, gateway, provider client and fake) it reports
// pushes/s (wall clock) and pushes/cpu-s (pushes per second of one
// core's CPU time, all of the process's work included).
func BenchmarkSendAPNs(b *testing.B) {
	for _, tc := range []struct {
		name    string
		metered bool
	}{{"unmetered", false}, {"metered", true}} {
		b.Run(tc.name, func(b *testing.B) {
			r := NewRig(b, Options{Metered: tc.metered})
			// Warm up: open the HTTP/2 connection, claim every token.
			var req fasthttp.Request
			var resp fasthttp.Response
			for range len(r.bodies) {
				if err := r.Send(&req, &resp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.SetParallelism(8)
			cpu0, wall0 := CPUTime(), time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var req fasthttp.Request
				var resp fasthttp.Response
				for pb.Next() {
					if err := r.Send(&req, &resp); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			cpu, wall := CPUTime()-cpu0, time.Since(wall0)
			b.ReportMetric(float64(b.N)/wall.Seconds(), "pushes/s")
			b.ReportMetric(float64(b.N)/cpu.Seconds(), "pushes/cpu-s")
		})
	}
}
