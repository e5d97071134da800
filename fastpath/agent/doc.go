// Package agent is the agent relay (contenox-relay/1): agent runtimes (the
// instances) dial out and hold one link each; browsers and phones (the
// clients) attach to an instance over WebSockets; the relay routes NDJSON
// frames between them on (instance, session) and nothing else.
//
// The contract is /spec/agent-relay.md. The parts that shape this code:
//
//   - The instance link is GET /v1/connect over TLS 1.3, upgraded to
//     contenox-relay/1 (not WebSocket) with fasthttp's hijack; after the
//     101 the TLS stream carries one JSON frame per line both ways. The
//     bearer token names the instance. 401 and 403 make the real connector
//     stop retrying for good, so they answer a bad token and nothing else.
//
//   - The relay proves itself with an Ed25519 signature over the
//     connector's nonce in relay.welcome (SigningInput, SignWelcome); its
//     key lives in the data dir (LoadOrCreateKey) and is published as 44
//     characters of padded base64 (PublicKeyString).
//
//   - Routed lines are forwarded as the bytes that arrived: frames from the
//     instance go to the attachment their session names, unchanged; frames
//     from a client get instance and session spliced in (package ndjson)
//     and nothing else changed. Nothing on that path decodes JSON or
//     allocates per frame.
//
//   - Every socket has a single writer and a send queue bounded in bytes,
//     never smaller than the largest frame that must pass it: a client
//     that does not read is closed with 1013 at its bound (its own queue,
//     or the bound on all of one instance's clients together, which drops
//     the one holding the most) while the instance and the other clients
//     keep flowing; a client that sends faster than the instance reads
//     waits for room in the link's queue.
//
// The handler routes between a link and the clients it holds itself; for
// an end it does not hold it asks Config.Route (route.Agent): on a single
// node nothing (route.AgentLocal), in a cluster another node
// (store/cluster/agentroute). Lines from another node are queued without
// waiting, as the route's reader must not wait for a socket: one for a
// client overflows it as above (1013); one from a client for a link whose
// queue is full closes that client with 1013 and detaches it (a client
// here would wait for room instead), and the runtime and the other
// clients flow on.
//
// Handler serves the three endpoints (/v1/connect, /v1/attach/<id>,
// /v1/pair/redeem); Keys is the operator's management of accounts, pairing
// keys and instances, used by the admin endpoints and the offline command
// line alike.
package agent
