#!/usr/bin/env bash
# `make bench`: compares, each figure beside a baseline measured in the
# same run on the same machine (ratios, not absolute times, count):
#   - the private channel relay, the mailbox's signal forwarding and the
#     agent relay's routing (both directions) with their net/http +
#     gorilla/websocket + encoding/json baselines (bench/baseline), each
#     relay a process of its own pinned to one core and the load generator
#     to another (taskset), in frames per relay CPU-second;
#   - mailbox HEAD and GET against the net/http baseline and synced
#     envelope PUTs against raw Pebble commits, pinned likewise;
#   - the memory of 10,000 idle mailbox watch sockets and of 10,000 idle
#     phone channels per relay (RSS per socket, each server a process of
#     its own);
#   - idle sockets parked (ws.Parker) beside a reader goroutine per
#     socket (bench/idlebench, issue 18): RSS per idle watch, signal,
#     phone and control socket, plain and TLS, at 10,000 each (capped to
#     the open-file limit, and said so), and the accept path's idle
#     connections that never upgrade; the added latency and CPU of a
#     delivery to a parked watch socket; a reconnect storm of 10,000
#     sockets against the binary's accept limits;
#   - our TURN server against coturn's turnserver (install it with
#     .ci/install-coturn.sh): synthetic ChannelData loads (UDP one
#     datagram per send, GRO-coalesced UDP input, TCP, TLS; and ours with
#     UDP_GRO on beside off), and real WebRTC
#     traffic (two headless Chromium pages over a relay-only data channel:
#     server CPU per MB, MB/s, the kernel's drops; skipped, and said so,
#     without /usr/bin/chromium);
#   - with go test -bench: the token bucket against golang.org/x/time/rate,
#     the channel codec against encoding/json, the SDK's seal and open
#     against raw AES-256-GCM, the relays' exact allocations per frame,
#     push fan-out and the push gateway against the fake APNs;
#   - the cluster routers (signal, private channel, agent) across a 3-node
#     embedded NATS cluster beside raw core NATS of the same bytes (CPU per
#     frame, p50/p99, allocations), and their back-pressure;
# then writes bench/results/latest.md (machine, Go version, cores, date,
# and per figure: ours, baseline, ratio with its spread, goal). Load
# comparisons alternate the two sides round by round (ABBA), drop the
# first round and report medians with the lowest and highest round.
# about 30 minutes on 2 cores; flags pass through
# (go run ./bench/cmd/benchreport -h lists them); QUICK=1 makes a short
# smoke run (about 3 minutes, figures indicative only).
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./bench/cmd/benchreport "$@"
