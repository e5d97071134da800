package agentbench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	baseline "edgerelay/bench/baseline/agent"
	"edgerelay/bench/relayserve"
	"edgerelay/bench/serverproc"
	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/tlsconf"
	"edgerelay/store"
)

// tlsSetup is the development certificate both relays serve, and the
// client configuration that trusts it.
type tlsSetup struct {
	server *tls.Config
	client *tls.Config
}

func newTLS(dir string) (tlsSetup, error) {
	paths, err := tlsconf.EnsureDevCert(dir, nil)
	if err != nil {
		return tlsSetup{}, err
	}
	rl, err := tlsconf.NewReloader(paths.Cert, paths.Key)
	if err != nil {
		return tlsSetup{}, err
	}
	caPEM, err := os.ReadFile(paths.CA)
	if err != nil {
		return tlsSetup{}, err
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return tlsSetup{}, errors.New("agentbench: no CA certificate")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return tlsSetup{}, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return tlsSetup{
		// The agent listener is TLS 1.3 only, for both relays.
		server: tlsconf.ServerConfig(rl, true),
		client: &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS13},
	}, nil
}

// startOurs serves fastpath/agent the way the binary does
// (relayserve.Agent: fastpath/server over TLS 1.3, Pebble behind the
// tokens) with one account and one instance paired through POST
// /v1/pair/redeem. dir holds the store and the key.
func startOurs(dir string, ts tlsSetup) (*target, error) {
	db, err := store.Open(dir, nil)
	if err != nil {
		return nil, err
	}
	key, err := agent.LoadOrCreateKey(dir)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	st := store.NewAgentStore(db)
	// Probes and pings are pushed beyond any run so that they never
	// interleave with the load.
	h, err := agent.New(agent.Config{Store: st, Key: key, HeartbeatEvery: time.Hour, ClientPing: time.Hour})
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	keys := agent.Keys{Store: st, Handler: h}
	clientToken, err := keys.AddAccount("bench")
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	pairKey, err := keys.PairKey("bench", 0)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	r, err := relayserve.Agent("", h, ts.server)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	t := &target{name: "ours", addr: r.Addr, tls: ts.client, clientToken: clientToken}
	t.close = func() error { return errors.Join(r.Close(), db.Close()) }
	if err := redeem(t, pairKey); err != nil {
		return nil, errors.Join(err, t.close())
	}
	return t, nil
}

// redeem pairs the target's instance over HTTPS, as a runtime does.
func redeem(t *target, key string) error {
	body, _ := json.Marshal(agent.RedeemRequest{Key: key, InstanceName: "bench"})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: t.tls}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Post("https://"+t.addr+"/v1/pair/redeem", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out agent.RedeemResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
		return fmt.Errorf("agentbench: redeem: %d %s", resp.StatusCode, raw)
	}
	t.instance, t.instToken = out.InstanceID, out.InstanceToken
	return nil
}

// startBaseline serves the net/http + gorilla/websocket + encoding/json
// baseline over the same TLS 1.3 configuration.
func startBaseline(ts tlsSetup) (*target, error) {
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil, err
	}
	t := &target{name: "baseline", tls: ts.client, instance: "inst-baseline",
		instToken: "instance-token-baseline", clientToken: "client-token-baseline"}
	h := baseline.New(key, baseline.Credentials{
		Instances: map[string]string{t.instToken: t.instance},
		Clients:   map[string][]string{t.clientToken: {t.instance}},
	})
	// Hijacked connections are not tracked by Shutdown; the rigs close
	// theirs before Close runs.
	r, err := relayserve.Baseline("baseline", "", h, ts.server, nil)
	if err != nil {
		return nil, err
	}
	t.addr, t.close = r.Addr, r.Close
	return t, nil
}

// ServeProcess is the body of cmd/agentserve, one relay of the comparison
// in a process of its own: it serves relay ("ours" or "baseline") with the
// TLS certificate kept in dir (which the benchmark made with the same
// development CA it trusts) and our relay's store and key below it, then
// serves serverproc's commands (see serverproc.Serve) until in ends. Its
// ready line is "ready <addr> <instance> <instance token> <client
// token>": ours has paired its instance through POST /v1/pair/redeem by
// then.
func ServeProcess(relay, dir string, in io.Reader, out io.Writer) (err error) {
	ts, err := newTLS(dir)
	if err != nil {
		return fmt.Errorf("agentserve: TLS: %w", err)
	}
	var t *target
	switch relay {
	case "ours":
		t, err = startOurs(filepath.Join(dir, "ours"), ts)
	case "baseline":
		t, err = startBaseline(ts)
	default:
		return fmt.Errorf("agentserve: unknown relay %q (want ours or baseline)", relay)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, t.close()) }()
	return serverproc.Serve(serverproc.ServeOptions{Ready: strings.Join([]string{t.addr, t.instance, t.instToken, t.clientToken}, " ")}, in, out)
}

// startProcess runs cmd/agentserve serving relay, pinned to cpu unless it
// is negative, and makes the target its ready line describes.
func startProcess(ctx context.Context, bin, relay, dir string, cpu int, ts tlsSetup) (*target, error) {
	p, err := serverproc.Start(ctx, relay, cpu, nil, bin, "-relay", relay, "-dir", dir)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(p.Ready)
	if len(f) != 4 {
		return nil, errors.Join(fmt.Errorf("agentbench: %s: ready line %q", relay, p.Ready), p.Stop())
	}
	return &target{name: relay, addr: f[0], tls: ts.client, instance: f[1], instToken: f[2], clientToken: f[3],
		close: p.Stop, proc: p}, nil
}
