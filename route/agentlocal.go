package route

import "context"

// AgentLocal is the single node's Agent: every link and client is on this
// node, so the handler routes every line itself and the route has nothing
// to carry. The attachment limit is the handler's own count, exact on one
// node.
type AgentLocal struct{}

// Link implements Agent.
func (AgentLocal) Link(context.Context, string, AgentLink) (AgentLinkHold, error) {
	return agentLocalHold{}, nil
}

// Attach implements Agent.
func (AgentLocal) Attach(context.Context, string, string, int, AgentClient) (AgentAttachment, error) {
	return agentLocalAttachment{}, nil
}

// Status implements Agent: the handler knows it all.
func (AgentLocal) Status(context.Context, string) (bool, int, bool, error) {
	return false, 0, false, nil
}

type agentLocalHold struct{}

func (agentLocalHold) ToSession(_, _ []byte) bool { return false }
func (agentLocalHold) Release()                   {}

type agentLocalAttachment struct{}

func (agentLocalAttachment) ToInstance([]byte) bool { return false }
func (agentLocalAttachment) Leave([]byte)           {}
