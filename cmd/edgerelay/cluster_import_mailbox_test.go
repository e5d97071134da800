package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// TestClusterImportMovesTheMailboxes: a single node's mailboxes (two
// claims, envelopes of both directions with one of the 64 KiB maximum, a
// prune, a push registration) move into a three-node cluster with
// `edgerelay cluster import`, and every node serves them as the single
// node did: each envelope byte for byte (GET, and a watch from 0), HEAD
// of each direction, a PUT at or below the pruned mark 409, another
// token's claim 409, the holder's heartbeat 204, and the registration:
// a write with X-Relay-Notify through each node pushes to the device
// registered on the single node (the sealed registration opens under the
// bearer in the cluster as it did there). A second import reports the
// same counts and duplicates nothing (HEAD counts unchanged).
func TestClusterImportMovesTheMailboxes(t *testing.T) {
	fake, pushEnv := mailboxPushEnv(t)
	single := startServer(t, append([]string{"RELAY_CHANNEL_LISTEN=", "RELAY_AGENT_LISTEN=",
		"RELAY_PUSH_FCM_LISTEN=", "RELAY_PUSH_APNS_LISTEN="}, pushEnv...)...)
	origin := single.origin("mailbox")
	l, quiet := newClusterLink(t, "chat"), newClusterLink(t, "chat")
	other := newClusterLink(t, "chat").token
	p2c, c2p, quietC2P := map[uint64][]byte{}, map[uint64][]byte{}, map[uint64][]byte{}
	put := func(l clusterLink, dir string, stored map[uint64][]byte, seq uint64, env []byte) {
		t.Helper()
		wantAnswer(t, fmt.Sprintf("PUT %s/%d on the single node", dir, seq), l.do(t, "PUT", l.url(origin, fmt.Sprintf("/%s/%d", dir, seq)), env, ""), 201, "")
		stored[seq] = env
	}
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(origin, ""), nil, ""), 201, "")
	wantAnswer(t, "claim of the quiet one", quiet.do(t, "PUT", quiet.url(origin, ""), nil, ""), 201, "")
	reg := fmt.Sprintf(`{"service":"apns","token":"%064x","environment":"production","tag":"imported"}`, 7)
	wantAnswer(t, "register p2c's reader", l.do(t, "PUT", l.url(origin, "/p2c/push"), []byte(reg), ""), 204, "")
	for seq := uint64(1); seq <= 4; seq++ {
		put(l, "p2c", p2c, seq, clusterEnvelope(seq, 100+int(seq), 'p'))
	}
	put(l, "p2c", p2c, 5, clusterEnvelope(5, 64<<10, 'P')) // RELAY_MAX_ENVELOPE's default
	wantAnswer(t, "prune p2c through 2", l.do(t, "DELETE", l.url(origin, "/p2c?through=2"), nil, ""), 204, "")
	delete(p2c, 1)
	delete(p2c, 2)
	for seq := uint64(1); seq <= 3; seq++ {
		put(l, "c2p", c2p, seq, clusterEnvelope(seq, 60, 'c'))
	}
	put(quiet, "c2p", quietC2P, 1, clusterEnvelope(1, 40, 'q'))
	if code := single.signal(syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("single node stop: exit %d", code)
	}

	c := startRelayCluster(t, 3, []string{"mailbox"}, pushEnv...)
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	heads := func(round int) {
		t.Helper()
		for i := range c.nodes {
			for _, h := range []struct {
				l    clusterLink
				dir  link.Direction
				want string
			}{{l, link.P2C, "first 3 last 5 count 3"}, {l, link.C2P, "first 1 last 3 count 3"}, {quiet, link.C2P, "first 1 last 1 count 1"}, {quiet, link.P2C, "first 0 last 0 count 0"}} {
				if got := headDir(t, h.l, node(i), h.dir); got != h.want {
					t.Fatalf("after import round %d, HEAD %s through node %d: %s, want %s", round, h.dir, i, got, h.want)
				}
			}
		}
	}
	importEnv := []string{"RELAY_NATS_URL=nats://" + c.nats[0]}
	want := "mailbox: 2 mailboxes\nmailbox: 7 envelopes\n"
	for round := range 2 { // the second run finds everything in place
		out := cliOK(t, importEnv, "cluster", "import", "--from", single.dataDir)
		if !strings.Contains(out, want) {
			t.Fatalf("import round %d:\n%s\nwant it to hold:\n%s", round, out, want)
		}
		heads(round)
	}

	for i := range c.nodes {
		for _, d := range []struct {
			l      clusterLink
			dir    string
			stored map[uint64][]byte
		}{{l, "p2c", p2c}, {l, "c2p", c2p}, {quiet, "c2p", quietC2P}} {
			for seq, env := range d.stored {
				a := d.l.do(t, "GET", d.l.url(node(i), fmt.Sprintf("/%s/%d", d.dir, seq)), nil, "")
				wantAnswer(t, fmt.Sprintf("GET %s/%d through node %d", d.dir, seq, i), a, 200, "")
				if !bytes.Equal(a.body, env) {
					t.Fatalf("GET %s/%d through node %d: %d bytes, not the %d the single node stored", d.dir, seq, i, len(a.body), len(env))
				}
			}
		}
		wantAnswer(t, fmt.Sprintf("GET of a pruned envelope through node %d", i), l.do(t, "GET", l.url(node(i), "/p2c/2"), nil, ""), 404, "not_found")
		wantAnswer(t, fmt.Sprintf("PUT at the pruned mark through node %d", i), l.do(t, "PUT", l.url(node(i), "/p2c/2"), clusterEnvelope(2, 102, 'p'), ""), 409, "conflict")
		wantAnswer(t, fmt.Sprintf("PUT below the pruned mark through node %d", i), l.do(t, "PUT", l.url(node(i), "/p2c/1"), clusterEnvelope(1, 30, 'z'), ""), 409, "conflict")
		wantAnswer(t, fmt.Sprintf("another token's claim through node %d", i), l.do(t, "PUT", l.url(node(i), ""), nil, other), 409, "taken")
		wantAnswer(t, fmt.Sprintf("the quiet one's heartbeat through node %d", i), quiet.do(t, "PUT", quiet.url(node(i), ""), nil, ""), 204, "")
		wantAnswer(t, fmt.Sprintf("the holder's heartbeat through node %d", i), l.do(t, "PUT", l.url(node(i), ""), nil, ""), 204, "")
	}
	w := openWatcher(t, l, node(2), link.C2P, 0)
	w.waitFor(t, "the watcher of c2p from 0 on node 2", len(c2p))
	w.wantExactly(t, "the watcher of c2p from 0 on node 2", c2p, 3)

	// The registration: one write with X-Relay-Notify through each node,
	// one push each to the device registered on the single node.
	for i := range c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		stored, err := l.on(node(i)).Put(ctx, link.P2C, uint64(6+i), clusterEnvelope(uint64(6+i), 40, 'n'), sdkmailbox.NotifyAlert)
		cancel()
		if err != nil || !stored {
			t.Fatalf("PUT p2c/%d with X-Relay-Notify through node %d: %v %v", 6+i, i, stored, err)
		}
	}
	got := fake.Wait(3, 20*time.Second)
	if len(got) != 3 {
		t.Fatalf("APNs received %d pushes, want 3 (one per write through each node)", len(got))
	}
	for _, r := range got {
		if r.Problem != "" || r.DeviceToken != fmt.Sprintf("%064x", 7) || !strings.Contains(string(r.Body), `"tag":"imported"`) {
			t.Fatalf("push %+v: want one to the imported registration's device and tag", r)
		}
	}
}
