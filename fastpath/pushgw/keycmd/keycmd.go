// Package keycmd is `edgerelay keys push`: the operator's management of
// push-gateway API keys (create, list, disable, enable, revoke). It talks
// to the running server through the admin listener when one answers, and
// opens the store itself when none runs (Pebble's lock keeps the two from
// ever writing at once).
package keycmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/admin/cliflag"
	"edgerelay/fastpath/pushgw"
	"edgerelay/store"
)

// Usage is the command's help.
const Usage = `usage:
  edgerelay keys push create --label LABEL [--expires WHEN] [--mount fcm|apns]
                                         create an API key; prints it once, alone on the last line
  edgerelay keys push list [--mount fcm|apns]
                                         list keys (never the keys themselves)
  edgerelay keys push disable --id ID    stop a key from sending (its claims free up after 60 s)
  edgerelay keys push enable --id ID     let a disabled key send again
  edgerelay keys push revoke --id ID     delete a key (its claims free up after 60 s)

WHEN is an RFC 3339 time (2026-01-31T00:00:00Z) or a duration from now (720h).
--mount is needed only when the FCM and APNs mounts keep separate key stores.
Each works against the running server (through the admin listener and the
admin token in the data dir) or, when no server runs, on the store itself.
`

// Config is what the command needs from its caller.
type Config struct {
	// DataDir is the relay's data dir (RELAY_DATA_DIR).
	DataDir string
	// AdminAddr is the running server's admin listener (RELAY_ADMIN_LISTEN).
	AdminAddr string
	// AdminTokenFile is the path of the admin token the running server
	// wrote; when it does not exist, no server runs.
	AdminTokenFile string
	// Separate is true when the mounts keep separate key stores; it
	// matters only offline (online, the server knows).
	Separate bool
	// Cluster is true in cluster mode: the keys live in the cluster, and
	// without a running node the command refuses instead of opening the
	// data dir's store.
	Cluster bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Run executes `edgerelay keys push <verb> [flags]` and returns the exit
// code: 0 done, 1 failed, 2 usage.
func Run(args []string, cfg Config, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		fmt.Fprint(stderr, Usage)
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("keys push "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr) // the error of a bad flag; the usage is printed below
	fs.Usage = func() {}
	label := fs.String("label", "", "label of the new key (1 to 64 characters)")
	expires := fs.String("expires", "", "expiry: RFC 3339 time or duration from now; empty: never")
	mount := fs.String("mount", "", "fcm or apns, when the mounts keep separate key stores")
	id := fs.String("id", "", "key id (from list)")
	// Flags before or after the key id, as in every edgerelay command.
	if err := cliflag.Parse(fs, args[1:]); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, Usage)
		return 0
	} else if err != nil {
		fmt.Fprint(stderr, "\n"+Usage)
		return 2
	}
	perKey := verb == "disable" || verb == "enable" || verb == "revoke"
	switch {
	case perKey && *id == "" && fs.NArg() == 1:
		*id = fs.Arg(0)
	case fs.NArg() > 0: // never dropped without a word
		fmt.Fprintf(stderr, "edgerelay keys push %s: unexpected argument %q\n\n%s", verb, fs.Arg(fs.NArg()-1), Usage)
		return 2
	}
	if *mount != "" && *mount != pushgw.ProviderFCM && *mount != pushgw.ProviderAPNs {
		fmt.Fprintf(stderr, "edgerelay keys push: --mount is fcm or apns\n")
		return 2
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	c := client{cfg: cfg, mount: *mount}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "edgerelay keys push %s: %v\n", verb, err)
		return 1
	}
	switch verb {
	case "create":
		if strings.TrimSpace(*label) == "" {
			fmt.Fprint(stderr, Usage)
			return 2
		}
		exp, err := parseExpiry(*expires, now())
		if err != nil {
			fmt.Fprintf(stderr, "edgerelay keys push create: %v\n", err)
			return 2
		}
		nk, err := c.create(*label, exp)
		if err != nil {
			return fail(err)
		}
		when := "never expires"
		if nk.ExpiresAt != nil {
			when = "expires " + nk.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(stdout, "push gateway key %s %q (%s); shown once, the relay keeps only its hash:\n%s\n", nk.ID, nk.Label, when, nk.Key)
	case "list":
		list, err := c.list()
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tLABEL\tSOURCE\tENABLED\tACTIVE\tCREATED\tEXPIRES\tBUCKET")
		for _, k := range list {
			exp, bucket := "never", "-"
			if k.ExpiresAt != nil {
				exp = k.ExpiresAt.Format(time.RFC3339)
			}
			if k.RegisteredIP != nil {
				bucket = *k.RegisteredIP
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%t\t%s\t%s\t%s\n", k.ID, k.Label, k.Source, k.Enabled, k.Active,
				k.CreatedAt.Format(time.RFC3339), exp, bucket)
		}
		_ = tw.Flush()
	case "disable", "enable", "revoke":
		if *id == "" {
			fmt.Fprint(stderr, Usage)
			return 2
		}
		if err := c.perKey(verb, *id); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%sd key %s\n", verb, *id) // disabled, enabled, revoked
	default:
		fmt.Fprint(stderr, Usage)
		return 2
	}
	return 0
}

// parseExpiry reads --expires: empty (never), an RFC 3339 time or a
// duration from now.
func parseExpiry(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(d), nil
	}
	return time.Time{}, fmt.Errorf("--expires %q: want an RFC 3339 time or a positive duration such as 720h", s)
}

// client reaches the keys through the running server or, when none runs,
// the store.
type client struct {
	cfg   Config
	mount string
}

// errNoServer means no server answered: use the store directly.
var errNoServer = admin.ErrNoServer

func (c client) create(label string, exp time.Time) (pushgw.NewKey, error) {
	var nk pushgw.NewKey
	req := pushgw.CreateKeyRequest{Label: label}
	if !exp.IsZero() {
		req.ExpiresAt = &exp
	}
	err := c.call(http.MethodPost, c.query(""), req, http.StatusCreated, &nk)
	if errors.Is(err, errNoServer) {
		err = c.offline(func(stores []*pushgw.Keys) error {
			var cerr error
			nk, cerr = stores[0].Create(label, exp)
			return cerr
		}, true)
	}
	return nk, err
}

func (c client) list() ([]pushgw.KeyInfo, error) {
	var list []pushgw.KeyInfo
	err := c.call(http.MethodGet, c.query(""), nil, http.StatusOK, &list)
	if errors.Is(err, errNoServer) {
		err = c.offline(func(stores []*pushgw.Keys) error {
			var lerr error
			list, lerr = stores[0].List()
			return lerr
		}, true)
	}
	return list, err
}

func (c client) perKey(verb, id string) error {
	method, suffix := http.MethodPost, "/"+url.PathEscape(id)+"/"+verb
	if verb == "revoke" {
		method, suffix = http.MethodDelete, "/"+url.PathEscape(id)
	}
	err := c.call(method, suffix, nil, http.StatusOK, nil)
	if errors.Is(err, errNoServer) {
		err = c.offline(func(stores []*pushgw.Keys) error {
			for _, k := range stores {
				if _, ok := k.Store.KeyByID(id); !ok {
					continue
				}
				switch verb {
				case "disable":
					return k.Disable(id)
				case "enable":
					return k.Enable(id)
				default:
					return k.Revoke(id)
				}
			}
			return pushgw.ErrUnknownKey
		}, false)
	}
	return err
}

func (c client) query(suffix string) string {
	if c.mount == "" {
		return suffix
	}
	return suffix + "?mount=" + c.mount
}

// offline opens the store and runs fn on the key stores it names: the
// shared one, or with separate stores the --mount one (one is true) or
// both.
func (c client) offline(fn func([]*pushgw.Keys) error, one bool) error {
	var scopes []store.PushScope
	switch {
	case !c.cfg.Separate:
		scopes = []store.PushScope{store.PushScopeShared}
	case c.mount == pushgw.ProviderFCM:
		scopes = []store.PushScope{store.PushScopeFCM}
	case c.mount == pushgw.ProviderAPNs:
		scopes = []store.PushScope{store.PushScopeAPNs}
	case one:
		return errors.New("the mounts keep separate key stores: add --mount fcm or --mount apns")
	default:
		scopes = []store.PushScope{store.PushScopeFCM, store.PushScopeAPNs}
	}
	if c.cfg.Cluster {
		return admin.ClusterOffline(c.cfg.AdminAddr)
	}
	db, err := store.Open(c.cfg.DataDir, nil)
	if err != nil {
		return fmt.Errorf("no server answered at %s and the store cannot be opened (is a server running with another admin address?): %w", c.cfg.AdminAddr, err)
	}
	var stores []*pushgw.Keys
	for _, s := range scopes {
		g, err := store.NewPushGateway(db, s)
		if err != nil {
			return errors.Join(err, db.Close())
		}
		stores = append(stores, &pushgw.Keys{Store: g, Now: c.cfg.Now})
	}
	return errors.Join(fn(stores), db.Close())
}

// call sends one admin request; errNoServer when there is no admin token
// (no server running on this data dir) or nothing listens.
func (c client) call(method, suffix string, body any, want int, out any) error {
	return admin.Call(c.cfg.AdminAddr, c.cfg.AdminTokenFile, method, pushgw.AdminPath+suffix, body, want, out)
}
