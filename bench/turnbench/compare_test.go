package turnbench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCompareSmoke runs one short round of each server at one payload for
// each load: UDP one datagram per send, GRO-coalesced UDP input (GSO
// runs from the clients, and from the echo peers too), the same against
// ours with GRO off, TURN over TCP and over TLS:
// the comparison's plumbing (building and pinning turnserve, starting
// coturn, the load generator, CPU and malloc accounting) works end to end.
// Each must relay and produce a ratio; TLS must negotiate the same suite
// on both. The figures of so short a run mean nothing; `make bench` takes
// them.
func TestCompareSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers per load")
	}
	for _, o := range []Options{
		{},
		{GSO: 16},
		{GSO: 16, PeerGSO: true},
		{GSO: 16, BaselineNoGRO: true},
		{Transport: TCP},
		{Transport: TLS},
	} {
		t.Run(o.LoadName(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			o.Rounds, o.Payloads, o.Duration, o.Progress = 2, []int{120}, 300*time.Millisecond, os.Stderr
			rep, err := Compare(ctx, o)
			if err != nil {
				t.Fatalf("Compare: %v", err)
			}
			if len(rep.Results) != 1 {
				t.Fatalf("%d results, want 1", len(rep.Results))
			}
			r := rep.Results[0]
			for _, s := range []Side{r.Ours, r.Baseline} {
				if len(s.Runs) != 1 || s.PerSec <= 0 || s.PerCoreSec <= 0 {
					t.Errorf("%s: %+v", s.Name, s)
				}
				for _, run := range s.Runs {
					if run.SendErrors > 0 {
						t.Errorf("%s: %d failed sends", s.Name, run.SendErrors)
					}
				}
			}
			if r.Ours.AllocsPerPacket < 0 {
				t.Errorf("ours: no allocations per packet")
			}
			switch {
			case o.BaselineNoGRO && (r.Baseline.Name != "ours-nogro" || r.Baseline.AllocsPerPacket < 0 || rep.Coturn != ""):
				t.Errorf("GRO-off baseline: %q, %v allocations per packet, coturn %q", r.Baseline.Name, r.Baseline.AllocsPerPacket, rep.Coturn)
			case !o.BaselineNoGRO && r.Baseline.Name != "coturn":
				t.Errorf("baseline %q, want coturn", r.Baseline.Name)
			}
			if o.Transport == TLS && (r.Ours.TLSSuite == "" || r.Ours.TLSSuite != r.Baseline.TLSSuite) {
				t.Errorf("TLS suites: ours %q, coturn %q", r.Ours.TLSSuite, r.Baseline.TLSSuite)
			}
			if r.Ratio <= 0 || len(r.RoundRatios) != 1 || r.RoundRatio != r.RoundRatios[0] {
				t.Errorf("ratio %v, per round %v (median %v)", r.Ratio, r.RoundRatios, r.RoundRatio)
			}
			md := rep.Markdown()
			if !strings.Contains(md, o.loadTitle()) || !strings.Contains(md, "| 120 B |") {
				t.Errorf("report lacks the load's title or its row:\n%s", md)
			}
			t.Logf("%s: ours %.0f pkt/core-s, %s %.0f, ratio %.2f; %.3f allocs/packet", o.LoadName(),
				r.Ours.PerCoreSec, r.Baseline.Name, r.Baseline.PerCoreSec, r.Ratio, r.Ours.AllocsPerPacket)
		})
	}
}

// TestOptionsRefuseImpossibleLoads: GSO runs only over UDP, a window of
// whole runs, runs the kernel takes.
func TestOptionsRefuseImpossibleLoads(t *testing.T) {
	for _, o := range []Options{
		{GSO: 16, Transport: TCP},
		{GSO: 16, Window: 24},
		{PeerGSO: true}, // echo peers in runs without the clients'
		{GSO: 65},
		{GSO: 64, Payloads: []int{1200}}, // 64 × 1,204 bytes is past 65,507
		{Transport: "quic"},
		{Transport: TCP, BaselineNoGRO: true}, // GRO is UDP's
		{BaselineNoGRO: true, BaselineTurnserve: "/bin/true"},
	} {
		if _, err := o.withDefaults(); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
	o, err := Options{GSO: 32}.withDefaults()
	if err != nil || o.Window != 64 {
		t.Errorf("GSO 32: window %d, %v; want 64", o.Window, err)
	}
}

// TestMarkdownShowsTheRoundsSpread: the per-round ratio comes with the
// smallest and largest of the rounds, so a reader sees how far apart they
// were.
func TestMarkdownShowsTheRoundsSpread(t *testing.T) {
	rep := Report{Options: Options{Rounds: 4, Payloads: []int{120}}, Results: []PayloadResult{{
		Payload: 120, Ratio: 1.1, RoundRatio: 1.05, RoundRatios: []float64{0.94, 1.2, 1.1},
		Ours: Side{Name: "ours"}, Baseline: Side{Name: "coturn"},
	}}}
	if md := rep.Markdown(); !strings.Contains(md, "| **1.10×** | 1.05× [0.94–1.20×] |") {
		t.Errorf("no spread of the rounds in:\n%s", md)
	}
}
