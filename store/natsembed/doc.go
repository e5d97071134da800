// Package natsembed runs a nats-server node with JetStream inside the edgerelay
// process, the way cluster mode (issue 15) will run it for 3 to 5 nodes: each
// edgerelay node embeds one server, the servers route to each other as one NATS
// cluster named "edgerelay", and the node's own code talks to its server over an
// in-process connection (no socket, no port to protect).
//
// JetStream uses file storage with sync_interval "always": every server fsyncs
// each entry before it counts towards a publish ack, so with Replicas 3 an
// acknowledged publish is on disk on a quorum (two of three servers). The
// default nats-server interval (2 minutes) would not give that promise.
//
// The settings that will map to Config (not defined yet; serve does not use this
// package yet):
//
//	RELAY_NODE_NAME                  -> Config.NodeName (default: the host name)
//	RELAY_NATS_EMBED_LISTEN          -> Config.ClientListen (set means cluster mode)
//	RELAY_NATS_EMBED_CLUSTER_LISTEN  -> Config.ClusterListen
//	RELAY_NATS_EMBED_ROUTES          -> Config.Routes (comma-separated nats-route://host:port)
//	RELAY_NATS_REPLICAS              -> Config.Replicas (default 3)
//	<data dir>/nats                  -> Config.StoreDir
package natsembed
