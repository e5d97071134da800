package main

import (
	"context"
	"fmt"
	"log/slog"

	"edgerelay/route"
	"edgerelay/store/cluster/channelroute"
)

// channelRoute is where the private channel's frames meet their other end:
// in this process on a single node, or across the cluster's nodes over
// core NATS (a phone's computer may be on another node).
func (r *relay) channelRoute(ctx context.Context, log *slog.Logger) (route.Channel, error) {
	if r.cluster == nil {
		return route.NewLocalChannel(), nil
	}
	rt, err := channelroute.New(ctx, r.cluster, channelroute.Config{Log: log})
	if err != nil {
		return nil, fmt.Errorf("channel: cluster routing: %w", err)
	}
	r.closers = append(r.closers, rt.Close)
	return rt, nil
}
