package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"edgerelay/internal/freeport"
)

// haproxy is a real L4 balancer (Debian's haproxy, installed by .ci/run)
// in front of a relayCluster: TCP mode, round robin per connection, so
// that consecutive connections of one client land on different nodes, as
// they do behind a production balancer that cannot see a mailbox id or a
// token.
type haproxy struct {
	addrs map[string]string // service -> the balancer's host:port
}

// startHAProxy balances each named service over the nodes' listeners of it.
func startHAProxy(t *testing.T, c *relayCluster, services ...string) *haproxy {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy (Debian package haproxy) is not installed: run .ci/install-package.sh haproxy haproxy haproxy")
	}
	h := &haproxy{addrs: map[string]string{}}
	var cfg strings.Builder
	cfg.WriteString("global\n  maxconn 4000\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 5m\n  timeout server 5m\n")
	sort.Strings(services)
	for _, svc := range services {
		h.addrs[svc] = freeport.TCP(t)
		fmt.Fprintf(&cfg, "frontend f_%s\n  bind %s\n  default_backend b_%s\n", svc, h.addrs[svc], svc)
		fmt.Fprintf(&cfg, "backend b_%s\n  balance roundrobin\n", svc)
		for i, n := range c.nodes {
			// Health checks take a killed node out of the rotation within
			// a second and put it back when it listens again.
			fmt.Fprintf(&cfg, "  server n%d %s check inter 300ms fall 2 rise 1\n", i, n.addrs[svc])
		}
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	for _, svc := range services {
		deadline := time.Now().Add(10 * time.Second)
		for {
			conn, err := net.DialTimeout("tcp", h.addrs[svc], 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("haproxy exited:\n%s", out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("haproxy does not listen on %s: %v\n%s", h.addrs[svc], err, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return h
}
