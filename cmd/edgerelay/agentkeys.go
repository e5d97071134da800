package main

import (
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/agent"
	"edgerelay/store"
)

const agentKeysUsage = `usage:
  edgerelay keys agent relay-key                  the relay's Ed25519 public key (44-character base64), for runtimes to pin
  edgerelay keys agent account add NAME           create an account; prints its client token once, alone on the last line
  edgerelay keys agent account list               list accounts
  edgerelay keys agent pair-key ACCOUNT [--ttl D] a single-use pairing key (default 15m), alone on the last line
  edgerelay keys agent instance list              list paired instances
  edgerelay keys agent instance revoke ID         revoke an instance and close its link

Flags may stand before or after the arguments; -- ends them. Each command
also takes --data-dir DIR and --admin-listen HOST:PORT (defaults from
RELAY_DATA_DIR and RELAY_ADMIN_LISTEN).
`

// runAgentKeys is `edgerelay keys agent …`.
func runAgentKeys(args []string, stdout, stderr io.Writer) int {
	if helpAsked(args) {
		fmt.Fprint(stdout, agentKeysUsage)
		return 0
	}
	values, err := config.Load(nil, os.Environ(), io.Discard)
	if err != nil {
		fmt.Fprintf(stderr, "edgerelay keys agent: %v\n", err)
		return 2
	}
	verb := ""
	if len(args) > 0 {
		verb = args[0]
	}
	if len(args) > 1 && (args[0] == "account" || args[0] == "instance") {
		verb, args = args[0]+" "+args[1], args[1:]
	}
	fs := flag.NewFlagSet("keys agent "+verb, flag.ContinueOnError)
	k := keysFlags(fs, values)
	ttl := fs.Duration("ttl", 15*time.Minute, "lifetime of a pairing key")
	if len(args) > 0 {
		if code, ok := parseFlags(fs, args[1:], agentKeysUsage, stdout, stderr); !ok {
			return code
		}
	}
	arg := fs.Arg(0)
	fail := func(err error) int {
		fmt.Fprintf(stderr, "edgerelay keys agent %s: %v\n", verb, err)
		return 1
	}
	switch {
	case verb == "relay-key" && fs.NArg() == 0:
		key, err := agent.LoadOrCreateKey(k.dataDir)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintln(stderr, "the relay's public key (pin it in the runtime):")
		fmt.Fprintln(stdout, agent.PublicKeyString(key.Public().(ed25519.PublicKey)))
	case verb == "account add" && fs.NArg() == 1:
		var resp admin.SecretResponse
		err := k.agent(http.MethodPost, "/accounts", admin.AccountRequest{Name: arg}, http.StatusCreated, &resp,
			func(keys agent.Keys) (err error) { resp.Secret, err = keys.AddAccount(arg); return err })
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "client token for account %q (shown once; the relay keeps only its hash):\n%s\n", arg, resp.Secret)
	case verb == "account list" && fs.NArg() == 0:
		var list []agent.AccountInfo
		err := k.agent(http.MethodGet, "/accounts", nil, http.StatusOK, &list,
			func(keys agent.Keys) (err error) { list, err = keys.Accounts(); return err })
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tINSTANCES\tCREATED")
		for _, a := range list {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", a.ID, a.Name, a.Instances, a.Created.Format(time.RFC3339))
		}
		_ = tw.Flush()
	case verb == "pair-key" && fs.NArg() == 1:
		var resp admin.SecretResponse
		err := k.agent(http.MethodPost, "/pair-keys", admin.PairKeyRequest{Account: arg, TTL: *ttl}, http.StatusCreated, &resp,
			func(keys agent.Keys) (err error) { resp.Secret, err = keys.PairKey(arg, *ttl); return err })
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "pairing key for account %q, single use, valid %v:\n%s\n", arg, *ttl, resp.Secret)
	case verb == "instance list" && fs.NArg() == 0:
		var list []agent.InstanceInfo
		err := k.agent(http.MethodGet, "/instances", nil, http.StatusOK, &list,
			func(keys agent.Keys) (err error) { list, err = keys.Instances(); return err })
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tACCOUNT\tREVOKED\tCONNECTED\tATTACHMENTS\tCREATED")
		for _, i := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%t\t%d\t%s\n", i.ID, i.Name, i.Account, i.Revoked, i.Connected, i.Attachments, i.Created.Format(time.RFC3339))
		}
		_ = tw.Flush()
	case verb == "instance revoke" && fs.NArg() == 1:
		err := k.agent(http.MethodDelete, "/instances/"+arg, nil, http.StatusOK, nil,
			func(keys agent.Keys) error { return keys.RevokeInstance(arg) })
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "revoked instance %s\n", arg)
	default:
		fmt.Fprint(stderr, agentKeysUsage)
		return 2
	}
	return 0
}

// agent runs one operation through the running server, or on the store
// when no server answers.
func (k keysClient) agent(method, suffix string, body any, want int, out any, offline func(agent.Keys) error) error {
	err := k.callAdmin(method, admin.AgentPath+suffix, body, want, out)
	if !errors.Is(err, errNoServer) {
		return err
	}
	db, err := k.openOffline()
	if err != nil {
		return err
	}
	ferr := offline(agent.Keys{Store: store.NewAgentStore(db)})
	return errors.Join(ferr, db.Close())
}
