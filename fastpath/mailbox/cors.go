package mailbox

import "edgerelay/fastpath/cors"

// CORSRules are what a page on another origin needs of the mailbox
// listener (spec/mailbox.md): the methods of its endpoints, the request
// headers a client sends beyond the safelisted ones (the bearer, the
// envelope's and the push registration's Content-Type, X-Relay-Notify on
// an envelope PUT), and the response headers a client reads (HEAD's
// sequences and count, a batch's X-Relay-More, Retry-After on 429 and
// 503). The spec has no conditional requests, so no If-* header is
// allowed. Watch and signal sockets need none of this: a browser's
// WebSocket is not subject to CORS (docs/cors.md).
func CORSRules() cors.Rules {
	return cors.Rules{
		Methods:        []string{"GET", "HEAD", "PUT", "DELETE"},
		RequestHeaders: []string{"Authorization", "Content-Type", "X-Relay-Notify"},
		ExposeHeaders:  []string{"X-Relay-First", "X-Relay-Last", "X-Relay-Count", "X-Relay-More", "Retry-After"},
	}
}
