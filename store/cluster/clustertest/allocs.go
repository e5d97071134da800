package clustertest

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The allocation count of a message that crosses nodes is the whole
// process's (the embedded servers' and the receiving router's included),
// so it must be read at a point where every receipt has happened:
// testing.AllocsPerRun reads it right after the last send, and counted
// anywhere from one to five allocations per message of one same path from
// run to run (and truncates to whole numbers), as the receipts fell inside
// its window or after it. AllocsPerHop waits for them, and RawHopAllocs is
// the same count for a raw core NATS message between the same two nodes,
// measured in the same run: the floor a router's hop is compared against.

// hopMessages is how many messages one count averages over.
const hopMessages = 2000

// AllocsPerHop is the whole process's allocations per message over
// hopMessages sends with send, counted from before the first send until
// arrived (a running count of what the receiving end got) has grown by
// hopMessages. One message is sent and received first, out of the count.
func AllocsPerHop(t testing.TB, send func(), arrived func() int64) float64 {
	t.Helper()
	waitArrived(t, arrived, arrived()+1, send)
	var before, after runtime.MemStats
	start := arrived()
	runtime.ReadMemStats(&before)
	for range hopMessages {
		send()
	}
	waitArrived(t, arrived, start+hopMessages, nil)
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / hopMessages
}

// waitArrived sends once with send (if not nil), then waits until
// arrived reaches want, failing t after 10 s.
func waitArrived(t testing.TB, arrived func() int64, want int64, send func()) {
	t.Helper()
	if send != nil {
		send()
	}
	deadline := time.Now().Add(10 * time.Second)
	for arrived() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the messages counted arrived in 10 s, want %d", arrived(), want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// RawHopAllocs is AllocsPerHop of raw core NATS messages of msg's bytes
// published on node from's connection to a subscriber on node to's whose
// callback only counts them.
func RawHopAllocs(t testing.TB, nodes *Nodes, from, to int, msg []byte) float64 {
	t.Helper()
	const subject = "er.alloc.hop"
	var got atomic.Int64
	sub, err := nodes.Node(to).Conn().Subscribe(subject, func(*nats.Msg) { got.Add(1) })
	if err != nil {
		t.Fatalf("subscribe on node %d: %v", to, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	pub := nodes.Node(from).Conn()
	send := func() { _ = pub.Publish(subject, msg) }
	// The interest crosses to node from's server some time after the
	// subscribe: until a message arrives, send again.
	Warm(t, func() bool { return got.Load() > 0 }, send)
	return AllocsPerHop(t, send, got.Load)
}

// HopSlack is how far a router's count may lie above the raw one of the
// same run: less than one allocation per message, so that one of the
// router's own on every message fails.
const HopSlack = 0.5
