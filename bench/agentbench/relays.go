package agentbench

import (
	"bytes"
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
	"time"

	baseline "edgerelay/bench/baseline/agent"
	"edgerelay/bench/relayserve"
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
