package agentroute_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgerelay/route"
	"edgerelay/store/cluster/agentroute"
)

// TestAgentRouteAttachContended: attachments that fit the limit are never
// refused because other nodes and this one write the instance's set at the
// same time: each node attaches at once while its earlier clients leave
// (the benchmark's "Attach beside an earlier Leave"), up to the limit
// exactly; one past it is refused; every slot is given back, so the set
// counts none soon after the last leave.
func TestAgentRouteAttachContended(t *testing.T) {
	_, rs := routers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const limit = 64
	var c sink
	// Round one: a third of the limit attached and left again, their
	// slots given back while round two attaches (contending writers).
	var early []route.AgentAttachment
	for k := range limit / 3 {
		a, err := rs[k%3].Attach(ctx, inst, session(1000+k), limit, &c)
		if err != nil {
			t.Fatalf("attachment %d: %v", k, err)
		}
		early = append(early, a)
	}
	var wg sync.WaitGroup
	atts := make([]route.AgentAttachment, limit)
	errs := make([]error, limit)
	for _, a := range early {
		a.Leave(nil)
	}
	// Round two: the whole limit at once, from every node. The slots of
	// round one may still be taken for a moment: those attaches wait for
	// them only as long as their leaves take, so the round is retried
	// until it fits.
	for k := range limit {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				atts[k], errs[k] = rs[k%3].Attach(ctx, inst, session(k), limit, &c)
				if !errors.Is(errs[k], route.ErrAgentFull) || ctx.Err() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("attachment %d of %d, contended: %v", k, limit, err)
		}
	}
	if _, err := rs[1].Attach(ctx, inst, session(limit), limit, &c); !errors.Is(err, route.ErrAgentFull) {
		t.Fatalf("attachment %d of %d: %v, want ErrAgentFull", limit+1, limit, err)
	}
	for _, a := range atts {
		a.Leave(nil)
	}
	waitFor(t, 5*time.Second, "every slot given back", func() bool {
		_, n, _, err := rs[2].Status(ctx, inst)
		return err == nil && n == 0
	})
}

// TestAgentRouteLeavesGiveSlotsBack: clients attaching and leaving at
// once on every node (each write contends with the others) give every
// slot they took back: the set counts none within a few seconds of the
// last leave. Attaches refused meanwhile are the other test's concern.
func TestAgentRouteLeavesGiveSlotsBack(t *testing.T) {
	_, rs := routers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const workers, rounds = 24, 4
	var c sink
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range rounds {
				a, err := rs[w%3].Attach(ctx, inst, session(w*rounds+k), 64, &c)
				if err == nil {
					a.Leave(nil)
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, 5*time.Second, "every slot given back", func() bool {
		_, n, _, err := rs[2].Status(ctx, inst)
		return err == nil && n == 0
	})
}

// TestAgentRouteAttachAfterLeaveHere: at the limit, a client leaving and
// another attaching through the same node at once is what a single node
// allows (its count drops at the leave): the new one is never refused
// while the leave's write is on its way, nor is the slot counted twice.
func TestAgentRouteAttachAfterLeaveHere(t *testing.T) {
	_, rs := routers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const limit = 2
	var c sink
	if _, err := rs[0].Attach(ctx, inst, session(100), limit, &c); err != nil {
		t.Fatal(err)
	}
	a, err := rs[1].Attach(ctx, inst, session(0), limit, &c)
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k <= 10; k++ {
		a.Leave(nil)
		if a, err = rs[1].Attach(ctx, inst, session(k), limit, &c); err != nil {
			t.Fatalf("attach %d beside the leave before it, at the limit: %v", k, err)
		}
	}
	if _, err := rs[2].Attach(ctx, inst, session(200), limit, &c); !errors.Is(err, route.ErrAgentFull) {
		t.Fatalf("one past the limit: %v, want ErrAgentFull", err)
	}
	waitFor(t, 5*time.Second, "the limit counted exactly", func() bool {
		_, n, _, err := rs[2].Status(ctx, inst)
		return err == nil && n == limit
	})
}

// TestAgentRouteAttachThroughElection: an attach made as the node leading
// the bucket's stream dies waits for the new leader (reads and writes
// tried again while the attach's bound lasts) instead of failing on the
// first request nobody answered; the instance's link state is read right.
func TestAgentRouteAttachThroughElection(t *testing.T) {
	nodes, rs := routers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := nodes.Node(0).JetStream().Stream(ctx, "KV_"+agentroute.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for k := range 3 {
		if info.Cluster != nil && info.Cluster.Leader == fmt.Sprintf("n%d", k) {
			leader = k
		}
	}
	if leader < 0 {
		t.Fatalf("no leader in %+v", info.Cluster)
	}
	linkNode, clientNode := (leader+1)%3, (leader+2)%3
	var link, c sink
	hold, err := rs[linkNode].Link(ctx, inst, &link)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	// Attaches through both other nodes, to instances new to them (each
	// reads the instance's link lease and writes its set), around the
	// stop: a request in flight to the dying leader is never answered.
	var wg sync.WaitGroup
	var stopped atomic.Bool
	errs := make(chan error, 64)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; !stopped.Load() || k < 2; k++ {
				r := rs[[]int{linkNode, clientNode}[w%2]]
				start := time.Now()
				name := fmt.Sprintf("inst-elect-%d-%d", w, k)
				if _, err := r.Attach(context.Background(), name, session(k), 64, &c); err != nil {
					errs <- fmt.Errorf("attach to %s, %v after it began: %w", name, time.Since(start), err)
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond) // the attaches under way
	nodes.Stop(leader)
	stopped.Store(true)
	a, err := rs[clientNode].Attach(context.Background(), inst, session(1), 64, &c)
	if err != nil {
		t.Fatalf("attach after the bucket's leader stopped: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !a.ToInstance([]byte(`{"type":"x"}`)) {
		t.Fatal("the link on another node not seen online")
	}
}
