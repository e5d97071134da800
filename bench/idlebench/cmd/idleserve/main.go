// Command idleserve is the server of the idle-socket benchmarks
// (bench/idlebench): the mailbox and private channel relays as the binary
// serves them, with or without a ws.Parker, plain or TLS, in a process of
// its own so that its resident memory and CPU time are its alone. See
// idlebench.ServeProcess for what it prints and answers; closing its
// standard input stops it.
//
//	idleserve -park on|off [-tls] [-mailboxes N] [-computers N] [-ping D] [-count sockets|conns] [-header-timeout D]
//	          [-max-conns N] [-max-conns-per-ip N] [-accept-rate R] [-accept-burst N]
package main

import (
	"flag"
	"fmt"
	"os"

	"edgerelay/bench/idlebench"
	"edgerelay/fastpath/netlimit"
)

func main() {
	var c idlebench.ServeConfig
	park := flag.String("park", "on", "park idle sockets (on) or keep a reader goroutine per socket (off)")
	flag.BoolVar(&c.TLS, "tls", false, "serve both listeners over TLS (a development certificate made at start-up)")
	flag.IntVar(&c.Mailboxes, "mailboxes", 0, "mailboxes to claim before listening")
	flag.IntVar(&c.Computers, "computers", 0, "computers to claim before listening")
	flag.DurationVar(&c.Ping, "ping", 0, "ping interval of every socket (0: the handlers' defaults)")
	flag.StringVar(&c.DataDir, "data", "", "the mailbox store's directory (a temporary one when empty)")
	count := flag.String("count", "sockets", "what the count command counts: the handlers' WebSockets (sockets) or the listeners' connections (conns)")
	flag.DurationVar(&c.HeaderTimeout, "header-timeout", 0, "RELAY_HEADER_TIMEOUT of both listeners (0: the binary's default)")
	var lim netlimit.Limits
	flag.IntVar(&lim.MaxConns, "max-conns", 0, "RELAY_MAX_CONNS of each listener (0: none)")
	flag.IntVar(&lim.MaxConnsPerIP, "max-conns-per-ip", 0, "RELAY_MAX_CONNS_PER_IP of each listener (0: none)")
	flag.Float64Var(&lim.AcceptRate, "accept-rate", 0, "RELAY_ACCEPT_RATE of each listener (0: none)")
	flag.IntVar(&lim.AcceptBurst, "accept-burst", 0, "RELAY_ACCEPT_BURST of each listener")
	flag.Parse()
	c.Limits = lim
	switch *count {
	case "sockets":
	case "conns":
		c.CountConns = true
	default:
		fmt.Fprintln(os.Stderr, "idleserve: -count sockets or conns")
		os.Exit(2)
	}
	switch *park {
	case "on":
		c.Park = true
	case "off":
	default:
		fmt.Fprintln(os.Stderr, "idleserve: -park on or off")
		os.Exit(2)
	}
	if err := idlebench.ServeProcess(c, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "idleserve:", err)
		os.Exit(1)
	}
}
