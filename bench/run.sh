#!/usr/bin/env bash
# `make bench`: compares the private channel relay, the mailbox relay and
# its signal forwarding with their net/http + gorilla/websocket baselines
# (and envelope writes with raw Pebble), our TURN server with coturn's
# turnserver (install it with .ci/install-coturn.sh; taskset pins each
# server to a core), measures push fan-out and the push gateway against
# the fake APNs, runs the hot path's micro benchmarks, then writes
# bench/results/latest.md. About 10 minutes on 2 cores.
# Flags pass through (go run ./bench/cmd/benchreport -h lists them);
# QUICK=1 makes a short smoke run (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./bench/cmd/benchreport "$@"
