// Package clusterbench measures cluster mode's mailbox backend
// (store/cluster/mailboxjs) on a 3-node embedded loopback cluster, beside
// its floor in the same run: raw JetStream publishes of the same bytes to
// the same R3 streams, and for watch delivery raw JetStream's RePublish of
// them to a plain subscription on another node. Run every case:
//
//	go test -run '^$' -bench . -benchtime 2s ./bench/clusterbench/
//
// Each write and watch case runs five times, the cases alternating (about
// 170 s in all); compare the medians. make bench runs three rounds of PUT,
// raw and watch only, 0.4 s each (about 30 s), selected by its -bench
// pattern (bench/cmd/benchreport/mailboxcluster.go):
//
//	go test -run '^$' -benchmem -benchtime 400ms \
//	  -bench '^BenchmarkCluster$/^(raw|put|pebble|watch)$/^(writers=(1|64)|ours|raw|pebble)(#0[1-2])?$' ./bench/clusterbench/
//
// Everything (three nats-servers, their clients, the writers) runs in one
// process, so allocations and CPU are those of the whole cluster; on a
// 2-core box the servers compete with the writers for CPU, which
// understates a real 3-machine cluster (CLUSTER.md §8.1).
package clusterbench
