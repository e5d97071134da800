package cluster

import (
	"context"
	"time"
)

// Node liveness. Every node keeps a record in the bucket er_nodes under its
// name, holding its incarnation, rewritten every livenessRefresh by the
// readiness probe (cluster.go); the bucket
// expires records livenessTTL after their last write, so a node that died
// (kill -9, power loss, a cut network) drops out of it by itself. Another
// node that holds state stamped with (node, incarnation), such as a push
// gateway token claim in flight, treats the state as abandoned once Alive
// says that incarnation is gone: a crashed node never pins anything for
// longer than livenessTTL.
const (
	nodesBucket     = "er_nodes"
	livenessTTL     = 10 * time.Second
	livenessRefresh = time.Second
)

// Alive reports whether node still runs the given incarnation: false once
// the node restarted (another incarnation) or has not refreshed its record
// for livenessTTL. An error means the shared store did not answer; callers
// keep what they hold until it does.
func (c *Cluster) Alive(ctx context.Context, node, incarnation string) (bool, error) {
	if node == c.node {
		return incarnation == c.incarnation, nil
	}
	e, err := c.nodes.Get(ctx, node)
	switch {
	case Absent(err):
		return false, nil
	case err != nil:
		return false, Fail("node liveness of "+node, err)
	}
	return string(e.Value()) == incarnation, nil
}
