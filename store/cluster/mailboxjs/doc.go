// Package mailboxjs is the mailbox's cluster backend: claims, envelopes,
// pruned marks, sealed push registrations, idle expiry and erase in
// JetStream, shared by every node, and watch across nodes: issue 15's
// mailbox. Store is the layout and its decisions; Mailboxes (below) is the
// store.Mailboxes the handler runs on in cluster mode.
// docs/cluster-mailbox.md has the figures.
//
// # Layout
//
// Mailboxes are sharded over Config.Shards R3 file streams ER_MBX_<k> by
// FNV-1a of "<app>/<id>". The servers run with sync_interval always, so a
// publish ack means the message is fsynced on a quorum (CLUSTER.md §1.2);
// nothing here acknowledges before that ack. Each direction has its own
// subject tree (see names): in-order envelopes on one subject .e, the rare
// envelope written below the direction's max on .o.<seq>, the prune mark
// on .m. The head of a direction (max, count, bytes, pruned mark, the
// envelope and push buckets, the stored set, the out-of-order list, the
// last write's time) rides in the Er-Head header of the direction's last
// message; its revision is that message's stream sequence.
//
// # Writes: one message, compare-and-set on the direction
//
// A Put decides against the head and publishes the envelope with the new
// head in its own headers and Nats-Expected-Last-Subject-Sequence: <rev>
// with Nats-Expected-Last-Subject-Sequence-Subject: the direction's
// wildcard, so that the server stores it only if no other message of the
// direction came first. One message, no batch: the envelope and its head
// cannot be split, and the write costs what a plain publish costs. An
// ADR-50 atomic batch (envelope plus a rollup head on its own subject)
// gives the same guarantee in two messages and a commit; measured in
// bench/clusterbench it was slower (docs/cluster-mailbox.md), which is why
// it is not used. A lost compare-and-set (10071, or 10164 while another
// write of the direction is in flight) re-reads the head from the leader
// and decides again. Heads a node wrote or read are cached (bounded), so
// the usual write is one publish: a stale cached head can only lose the
// compare-and-set, and every answer other than a write is decided again
// on the leader's head.
//
// Keeping .e ascending in client sequence is what makes lookups cheap
// without a subject per envelope (millions of subjects cost the servers
// memory and recovery time, CLUSTER.md §4.1): a sequence is found by
// binary search over the stream range of .e, an out-of-order one by its
// own subject. The stored set is a list of runs (one while the writer
// appends), so retries, HEAD and the 507 check need no lookup.
//
// # Watch
//
// See Watch: subscribe to the RePublish subject er.w.<app>.<id>.<dir>.>
// first, then read the head from the leader and backfill up to it; drop
// republished messages at or below the last handled; every message names
// its predecessor (the Nats-Expected-Last-Subject-Sequence of its own
// compare-and-set), so a gap is read back from the stream. The
// NATS callback only appends to a bounded queue; Deliver runs on the
// watch's goroutine.
//
// # Mailboxes: store.Mailboxes
//
// Mailboxes (mailboxes.go, presence.go, watchhub.go) is what the relay's
// handler uses; the decisions stay the Store's. What it adds, per node:
//
//   - The claim cache: Open authorizes from the node's copy of the claim
//     record (bounded, 64k entries, sampled eviction), so an authorized
//     request costs no round trip. An entry that looks idle past Idle, or
//     was last read more than TouchEvery ago, is read again through the
//     leader (with the heads when the record looks idle: writes stamp
//     them), so a lost control message leaves an entry stale for at most
//     TouchEvery. Every removal of a mailbox (Erase, the sweeper, a claim
//     taking over an idle one) publishes erased on er.mbx.<app>.<id>.ctl;
//     one wildcard subscription per node drops the entry, ends the node's
//     watches of it and calls OnGone. A refused Open adds nothing.
//   - Activity: a stored envelope touches the claim record when the
//     node's view of it is TouchEvery old (the head has each write's time
//     at once). A heartbeat within TouchEvery of the stored value writes
//     nothing (declared to the contract as CoalescedHeartbeats).
//   - Watcher places and the foreground mark (presence.go): the
//     er_watch bucket, exact across nodes; a reader in the foreground on
//     another node is found by a core request on er.fg.<app>.<id>.<dir>,
//     answered only by a node whose reader is in the foreground.
//   - Watches without a goroutine while they wait (watchhub.go), checked
//     against the leader's head and claim every 30 s after the connection
//     reconnected or dropped their messages: a notification lost with
//     nothing after it, or a lost erased, is caught then.
//
// Departures from the spec, kept and declared to the contract suite: the
// envelope bucket is per direction, in the head, not per mailbox (exact
// across nodes without a second compare-and-set per write; a mailbox
// whose two sides both write gets twice the rate), and the head's set
// caps make a direction whose sequences are spread by thousands full
// (507) before it holds RELAY_MAX_STORED envelopes.
//
// # Errors
//
// Every NATS or JetStream failure (timeout, no quorum, no responders) is
// wrapped by cluster.Fail as store.ErrUnavailable, answered 503. A write
// that failed so may have been applied (its ack lost): the client's retry
// finds the same bytes stored and gets 200, and nothing is pushed twice.
package mailboxjs
