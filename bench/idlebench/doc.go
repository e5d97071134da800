// Package idlebench measures what parking idle WebSockets off their
// goroutines (ws.Parker, issue 18) buys and costs, each figure parked
// beside today's path (a reader goroutine per socket) in the same run,
// the two sides alternating round by round in fresh server processes
// (cmd/idleserve: the mailbox and private channel relays served as the
// binary serves them, plain or TLS):
//
//   - MeasureMemory: the resident memory of an idle socket of each kind
//     (mailbox watch and signal, phone channel, control socket; and the
//     accept path's connections that never upgrade), serverproc's
//     reading before and after thousands of them open, with the
//     runtime's stacks and heap and the goroutines per socket. More
//     sockets than the open-file limit allows are capped, and said so.
//   - MeasureWake: a delivery to a parked watch socket (an envelope PUT
//     until the watcher reads it) and the client's own wake (a text ping
//     until its pong): p50, p99 and server CPU per wake.
//   - MeasureStorm: every socket reset at once and reconnecting against
//     the binary's accept limits: the time until all are back, and that
//     nothing but the accept rate refused them.
//
// The clients come from loopback aliases (127.0.0.2, …) so that each
// source address has ephemeral ports to spare, and both processes raise
// their open-file limit to the hard one. cmd/idlebench prints the
// figures; `make bench` (bench/cmd/benchreport) reports them with the
// issue's goals.
package idlebench
