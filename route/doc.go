// Package route is where the live frames of a protocol find their other
// end: on this node, or across the nodes of a cluster. Each protocol has
// one interface here, implemented for the single node in this package
// (today's in-process routing, at its cost: frames between two sockets of
// one node never leave the process) and for a cluster over core NATS in
// store/cluster/<protocol>route. A protocol handler never learns which
// one it runs on.
package route
