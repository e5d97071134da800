#!/usr/bin/env bash
# make cluster: three edgerelay nodes in cluster mode on this machine, each
# embedding a nats-server (JetStream R3), on loopback, with their own data
# dirs and ports; one line per node says where it listens. Ctrl-C (or
# SIGTERM) drains and stops all three. For trying cluster mode, not for
# production: there every node runs on its own machine (README, Cluster mode).
#
#   EDGERELAY_BIN  binary to run (default: builds bin/edgerelay)
#   CLUSTER_DIR    parent of the nodes' data dirs (default: ./data/cluster)
#   PORT_STEP      node i listens on each default port + i*PORT_STEP (default 100)
#   SERVICES       services to turn on (default: those whose state cluster mode shares)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${EDGERELAY_BIN:-}
if [ -z "$bin" ]; then
	go build -o bin/edgerelay ./cmd/edgerelay
	bin=bin/edgerelay
fi
dir=${CLUSTER_DIR:-./data/cluster}
step=${PORT_STEP:-100}
services=${SERVICES:-turn}

# Default ports of every service (cmd/edgerelay/config: defaultListen).
declare -A port=([mailbox]=8080 [channel]=8081 [push-fcm]=8082 [push-apns]=8083 [agent]=8443 [turn]=3478)
routes=""
for i in 1 2 3; do
	routes+="${routes:+,}nats-route://127.0.0.1:$((6222 + i * step))"
done

pids=()
stop() {
	trap - INT TERM
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait
}
trap stop INT TERM

for i in 1 2 3; do
	mkdir -p "$dir/node$i"
	env=(
		RELAY_DATA_DIR="$dir/node$i"
		RELAY_NODE_NAME="node$i"
		RELAY_ADMIN_LISTEN="127.0.0.1:$((9090 + i * step))"
		RELAY_NATS_EMBED_LISTEN="127.0.0.1:$((4222 + i * step))"
		RELAY_NATS_EMBED_CLUSTER_LISTEN="127.0.0.1:$((6222 + i * step))"
		RELAY_NATS_EMBED_ROUTES="$routes"
	)
	line="node$i: admin http://127.0.0.1:$((9090 + i * step)), nats 127.0.0.1:$((4222 + i * step))"
	for s in mailbox channel push-fcm push-apns agent turn; do
		envname=RELAY_$(echo "$s" | tr 'a-z-' 'A-Z_')_LISTEN
		if [[ " $services " == *" $s "* ]]; then
			env+=("$envname=127.0.0.1:$((${port[$s]} + i * step))")
			line+=", $s 127.0.0.1:$((${port[$s]} + i * step))"
		else
			env+=("$envname=")
		fi
	done
	env "${env[@]}" "$bin" serve >"$dir/node$i.out" 2>"$dir/node$i.log" &
	pids+=($!)
	echo "$line; data $dir/node$i, log $dir/node$i.log"
done
echo "starting: each node serves once the three have a JetStream quorum (/readyz 200); Ctrl-C stops them"
wait
