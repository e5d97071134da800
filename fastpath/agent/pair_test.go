package agent_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/agent"
	"edgerelay/store"
)

func TestPairRedeem(t *testing.T) {
	r := startRelay(t, relayOpts{})
	r.account("acme")
	key, err := r.keys.PairKey("acme", 0)
	if err != nil || len(key) != 64 {
		t.Fatalf("pairing key %q %v", key, err)
	}
	a := r.post("/v1/pair/redeem", map[string]string{"key": key, "instance_name": "build-box.local"})
	if a.status != 200 || a.header.Get("Cache-Control") != "no-store" || !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
		t.Fatalf("redeem: %d %v %s", a.status, a.header, a.raw)
	}
	var resp map[string]string
	if err := json.Unmarshal(a.raw, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp) != 4 || len(resp["instance_token"]) != 64 || !strings.HasPrefix(resp["instance_id"], "inst-") ||
		!strings.HasPrefix(resp["account_id"], "acct-") || resp["relay_public_key"] != r.pub || len(r.pub) != 44 {
		t.Fatalf("answer %s", a.raw)
	}

	// Single use.
	a = r.post("/v1/pair/redeem", map[string]string{"key": key, "instance_name": "again"})
	if a.status != 403 || errorMessage(t, a) != "pairing key already used" {
		t.Fatalf("second redeem: %d %s", a.status, a.raw)
	}
	a = r.post("/v1/pair/redeem", map[string]string{"key": strings.Repeat("f", 64), "instance_name": "x"})
	if a.status != 403 || errorMessage(t, a) != "unknown pairing key" {
		t.Fatalf("unknown key: %d %s", a.status, a.raw)
	}

	// Fifteen minutes by default: valid just before, refused at the end.
	early, _ := r.keys.PairKey("acme", 0)
	late, _ := r.keys.PairKey("acme", 0)
	r.clock.Add(15*time.Minute - time.Second)
	if a := r.post("/v1/pair/redeem", map[string]string{"key": early, "instance_name": "x"}); a.status != 200 {
		t.Fatalf("redeem before expiry: %d %s", a.status, a.raw)
	}
	r.clock.Add(time.Second)
	a = r.post("/v1/pair/redeem", map[string]string{"key": late, "instance_name": "x"})
	if a.status != 403 || errorMessage(t, a) != "pairing key expired" {
		t.Fatalf("expired key: %d %s", a.status, a.raw)
	}

	// Malformed bodies are 400 and spend nothing.
	fresh, _ := r.keys.PairKey("acme", time.Hour)
	for name, body := range map[string]string{
		"not JSON":        `key=x`,
		"no key":          `{"instance_name":"x"}`,
		"no name":         `{"key":"` + fresh + `"}`,
		"empty name":      `{"key":"` + fresh + `","instance_name":""}`,
		"control in name": `{"key":"` + fresh + `","instance_name":"a\nb"}`,
		"long name":       `{"key":"` + fresh + `","instance_name":"` + strings.Repeat("n", 257) + `"}`,
		"huge body":       `{"key":"` + fresh + `","instance_name":"x","pad":"` + strings.Repeat(" ", 5000) + `"}`,
	} {
		a := r.post("/v1/pair/redeem", body)
		if a.status != 400 {
			t.Errorf("%s: %d %s", name, a.status, a.raw)
			continue
		}
		errorMessage(t, a)
	}
	if a := r.post("/v1/pair/redeem", map[string]string{"key": fresh, "instance_name": strings.Repeat("n", 256)}); a.status != 200 {
		t.Fatalf("the fresh key was spent by a malformed request: %d %s", a.status, a.raw)
	}
	if a := r.do("GET", "/v1/pair/redeem", nil, nil); a.status != 405 {
		t.Fatalf("GET: %d", a.status)
	}
	if a := r.do("GET", "/nope", nil, nil); a.status != 404 {
		t.Fatalf("unknown path: %d", a.status)
	}
}

func TestKeys(t *testing.T) {
	r := startRelay(t, relayOpts{})
	k := r.keys
	tok, err := k.AddAccount("acme")
	if err != nil || len(tok) != 64 {
		t.Fatalf("client token %q %v", tok, err)
	}
	if _, err := k.AddAccount("acme"); !errors.Is(err, store.ErrAccountExists) {
		t.Fatalf("duplicate: %v", err)
	}
	for _, bad := range []string{"", "has space", strings.Repeat("a", 65), "slash/"} {
		if _, err := k.AddAccount(bad); !errors.Is(err, agent.ErrBadAccountName) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	if _, err := k.PairKey("nobody", 0); !errors.Is(err, store.ErrUnknownAccount) {
		t.Fatalf("pair key for unknown account: %v", err)
	}
	if _, err := k.PairKey("acme", -time.Second); err == nil {
		t.Fatal("negative lifetime accepted")
	}
	accts, err := k.Accounts()
	if err != nil || len(accts) != 1 || accts[0].Name != "acme" || accts[0].Instances != 0 {
		t.Fatalf("accounts %+v %v", accts, err)
	}
	// A pairing key may name the account by id too.
	key, err := k.PairKey(accts[0].ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	a := r.post("/v1/pair/redeem", map[string]string{"key": key, "instance_name": "h1"})
	var resp agent.RedeemResponse
	_ = json.Unmarshal(a.raw, &resp)
	p := paired{id: resp.InstanceID, token: resp.InstanceToken}
	c := r.connect(p)
	cl, _ := r.attachedSession(p, tok, c)
	_ = cl
	list, err := k.Instances()
	if err != nil || len(list) != 1 {
		t.Fatalf("instances %+v %v", list, err)
	}
	in := list[0]
	if in.ID != p.id || in.Name != "h1" || in.Account != "acme" || !in.Connected || in.Attachments != 1 || in.Revoked {
		t.Fatalf("instance %+v", in)
	}
	if accts, _ := k.Accounts(); accts[0].Instances != 1 {
		t.Fatalf("accounts %+v", accts)
	}
	if err := k.RevokeInstance("inst-nope"); !errors.Is(err, store.ErrUnknownInstance) {
		t.Fatalf("revoke unknown: %v", err)
	}

	// Offline (no Handler): the same operations on the store alone.
	off := agent.Keys{Store: r.st}
	if _, err := off.AddAccount("globex"); err != nil {
		t.Fatal(err)
	}
	if err := off.RevokeInstance(p.id); err != nil {
		t.Fatal(err)
	}
	list, _ = off.Instances()
	if !list[0].Revoked || list[0].Connected {
		t.Fatalf("offline list %+v", list)
	}
}
