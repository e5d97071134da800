// Package clusterbench measures cluster mode's mailbox backend
// (store/cluster/mailboxjs) on a 3-node embedded loopback cluster, beside
// its floor in the same run: raw JetStream publishes of the same bytes to
// the same R3 streams. Run:
//
//	go test -run '^$' -bench . -benchtime 2s ./bench/clusterbench/
//
// Each case runs five times, the cases alternating (about 150 s in all);
// compare the medians.
// Everything (three nats-servers, their clients, the writers) runs in one
// process, so allocations and CPU are those of the whole cluster; on a
// 2-core box the servers compete with the writers for CPU, which
// understates a real 3-machine cluster (CLUSTER.md §8.1).
package clusterbench
