package main

import (
	"context"
	"fmt"

	"edgerelay/fastpath/agent"
	"edgerelay/route"
	"edgerelay/store/cluster/agentroute"
)

// newAgent makes the agent relay's handler with its route: in-process on a
// single node, across the nodes in cluster mode, so that a runtime's link
// on one node and its clients on others meet.
func (r *relay) newAgent(ctx context.Context, cfg agent.Config) (*agent.Handler, error) {
	cfg.Route = route.AgentLocal{}
	if r.cluster != nil {
		rt, err := agentroute.New(ctx, r.cluster, cfg.Log)
		if err != nil {
			return nil, fmt.Errorf("agent: cluster route: %w", err)
		}
		cfg.Route = rt
	}
	return agent.New(cfg)
}
