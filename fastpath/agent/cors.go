package agent

import "edgerelay/fastpath/cors"

// CORSRules are what a page on another origin needs of the agent
// listener (spec/agent-relay.md). Of its three endpoints only
// POST /v1/pair/redeem is a request a page's fetch makes and CORS
// governs (a JSON body, so a preflight): a runtime's setup page on its
// own origin may redeem the pairing key the operator handed out. Browser
// clients attach with a WebSocket (/v1/attach/<id>), which CORS does not
// cover: it authenticates by the bearer subprotocol (docs/cors.md). And
// no page can open /v1/connect: Upgrade is a header a page may not set.
// The redeem answer is JSON read from its body, so no header is exposed.
func CORSRules() cors.Rules {
	return cors.Rules{
		Methods:        []string{"POST"},
		RequestHeaders: []string{"Content-Type"},
	}
}
