#!/usr/bin/env bash
# `make bench`: compares our private channel relay with its baseline and
# runs the hot path's micro benchmarks, then writes bench/results/latest.md.
# Flags pass through (go run ./bench/cmd/benchreport -h lists them);
# QUICK=1 makes a short smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./bench/cmd/benchreport "$@"
