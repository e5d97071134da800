package agentroute_test

// The benchmarks' clients (bench_test.go) as route.AgentClient: they are
// never fenced, and no link of theirs has a bounded queue that they could
// overflow.

func (*client) Overflowed()        {}
func (*client) Fenced()            {}
func (*boundedClient) Overflowed() {}
func (*boundedClient) Fenced()     {}
