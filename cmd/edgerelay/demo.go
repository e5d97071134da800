package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/valyala/fasthttp"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/cors"
)

// The first-run demo (RELAY_DEMO, make run): a newcomer's relay shows
// every service working without a setting, and production, which leaves
// RELAY_DEMO off, keeps its defaults (no apps, no TURN secret: both off).

// demoApp is the mailbox app the demo serves when RELAY_APPS is unset;
// with TURN on it has ice as well.
const demoApp = "demo:signal"

// demoService names the demo's listener in start-up lines, logs and
// metrics.
const demoService config.Service = "demo"

// demoSecretFile holds the TURN secret the demo generates on its first
// start, in the data dir, so that a restart keeps the credentials valid.
const demoSecretFile = "turn.secret"

// demoPeers are the addresses a demo TURN server may relay to: the
// browsers of a demo run on this machine, so their relayed addresses are
// loopback ones, which TURN otherwise refuses (no relaying into the host).
var demoPeers = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// applyDemo fills what RELAY_DEMO turns on; without it cfg is returned as
// it is. It refuses a demo with any listener off loopback: the demo lets
// TURN relay to loopback addresses and serves a development tree, neither
// of which may be reachable from another machine.
func applyDemo(cfg config.Config) (config.Config, error) {
	if !cfg.Demo.On {
		return cfg, nil
	}
	listeners := map[string]string{config.EnvAdminListen: cfg.AdminListen, config.EnvDemoListen: cfg.Demo.Listen}
	for _, s := range config.Services() {
		listeners[s.ListenEnv()] = cfg.Listeners[s].Addr
	}
	for env, addr := range listeners {
		if addr != "" && !loopbackAddr(addr) {
			return cfg, fmt.Errorf("%s: %s=%s is not a loopback address; the demo relays to loopback peers and serves a development tree, so it runs on loopback only (turn %s off to serve others)",
				config.EnvDemo, env, addr, config.EnvDemo)
		}
	}
	if cfg.Mailbox.Apps == "" {
		cfg.Mailbox.Apps = demoApp
		if cfg.Listeners[config.TURN].On() {
			cfg.Mailbox.Apps += ",ice"
		}
	}
	if cfg.Listeners[config.TURN].On() {
		if cfg.TURN.Secret == "" {
			if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
				return cfg, fmt.Errorf("%s: data dir: %w", config.EnvDemo, err)
			}
			secret, err := loadOrCreateSecret(filepath.Join(cfg.DataDir, demoSecretFile))
			if err != nil {
				return cfg, fmt.Errorf("%s: TURN secret: %w", config.EnvDemo, err)
			}
			cfg.TURN.Secret = config.Secret(secret)
		}
		cfg.TURN.AllowPeers = append(cfg.TURN.AllowPeers, demoPeers...)
	}
	if cfg.Demo.Listen == "" {
		return cfg, nil
	}
	addr, err := fixPort(cfg.Demo.Listen)
	if err != nil {
		return cfg, fmt.Errorf("%s: %w", config.EnvDemoListen, err)
	}
	cfg.Demo.Listen = addr
	if !cfg.CORS.Any() {
		origins := append(cfg.CORS.List(), demoOrigins(addr)...)
		if cfg.CORS, err = cors.ParseOrigins(strings.Join(origins, ",")); err != nil {
			return cfg, fmt.Errorf("%s: demo origins: %w", config.EnvDemo, err)
		}
	}
	return cfg, nil
}

// demoOrigins are the origins a browser gives the demo listener's pages:
// the address as listened on and, for 127.0.0.1, localhost too.
func demoOrigins(addr string) []string {
	out := []string{"http://" + addr}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "127.0.0.1" {
		out = append(out, "http://localhost:"+port)
	}
	return out
}

// fixPort turns a port 0 into a port free now: the mailbox's CORS origins
// must name the demo origin's port before the listeners start.
func fixPort(addr string) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if port != "0" {
		return addr, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// loopbackAddr reports whether host:port names a loopback host.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// loadOrCreateSecret reads a secret file, or writes one of 32 random bytes
// (hex) with mode 0600 when there is none.
func loadOrCreateSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("%s is empty", path)
		}
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	s := hex.EncodeToString(raw[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(s + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return s, f.Close()
}

// demoHandler serves the SDK's directory (its dist/ and examples/) as
// static files, "/" leading to the chat example. It reports why the demo
// app cannot be served when the SDK is not built.
func demoHandler(dir string) (fasthttp.RequestHandler, error) {
	if _, err := os.Stat(filepath.Join(dir, "dist", "index.js")); err != nil {
		return nil, fmt.Errorf("%s has no dist/index.js: build the SDK with make js", dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	files := (&fasthttp.FS{Root: abs, IndexNames: []string{"index.html"}, AcceptByteRange: false}).NewRequestHandler()
	return func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/" {
			ctx.Redirect("/examples/chat/", fasthttp.StatusFound)
			return
		}
		files(ctx)
	}, nil
}
