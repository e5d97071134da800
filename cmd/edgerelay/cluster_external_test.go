package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgerelay/internal/freeport"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// externalNATS is an external NATS cluster as an operator runs one: three
// nats-servers (in the test process) routed on loopback, JetStream on file
// storage synced on every write, TLS on the client port, and operator/JWT
// authentication, so that a .creds file is what lets a client in.
type externalNATS struct {
	urls     string // tls://host:port of every server, comma-separated (RELAY_NATS_URL)
	ca       string // PEM file of the CA that signed the servers' certificate
	dir      string
	operator nkeys.KeyPair
	// resolver holds the account JWTs the servers trust (one map shared by
	// the three servers): storing one lets its users in from the next
	// connection attempt on.
	resolver *server.MemAccResolver
}

// startExternalNATS starts the cluster and waits until every server
// accepts connections (JetStream elects its leaders once the relay's nodes
// ask it something; they wait for that).
func startExternalNATS(t *testing.T) *externalNATS {
	t.Helper()
	e := &externalNATS{dir: t.TempDir(), operator: mustKP(t, nkeys.CreateOperator), resolver: &server.MemAccResolver{}}
	caCert, caKey := newCA(t, e.dir, "ca.pem")
	e.ca = filepath.Join(e.dir, "ca.pem")
	serverCert := newLeaf(t, caCert, caKey)

	op := jwt.NewOperatorClaims(mustPub(t, e.operator))
	op.Name = "edgerelay-test"
	sys := e.account(t, "SYS", false)
	op.SystemAccount = mustPub(t, sys)
	opJWT, err := op.Encode(e.operator)
	if err != nil {
		t.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}

	var clients, routes []string
	var routeURLs []*url.URL
	for range 3 {
		clients = append(clients, freeport.TCP(t))
		r := freeport.TCP(t)
		routes = append(routes, r)
		routeURLs = append(routeURLs, &url.URL{Scheme: "nats-route", Host: r})
	}
	var servers []*server.Server
	var logs []*natsLog
	for i := range 3 {
		host, port := splitPort(t, clients[i])
		_, rport := splitPort(t, routes[i])
		opts := &server.Options{
			ServerName: fmt.Sprintf("ext%d", i),
			Host:       host, Port: port,
			Cluster:   server.ClusterOpts{Name: "external", Host: host, Port: rport},
			Routes:    routeURLs,
			JetStream: true, StoreDir: filepath.Join(e.dir, fmt.Sprintf("js%d", i)), SyncAlways: true,
			TLS: true, TLSTimeout: 5,
			TLSConfig:        &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12},
			TrustedOperators: []*jwt.OperatorClaims{opClaims},
			AccountResolver:  e.resolver,
			SystemAccount:    op.SystemAccount,
			NoSigs:           true,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("nats-server %d: %v", i, err)
		}
		lg := &natsLog{}
		s.SetLoggerV2(lg, false, false, false)
		go s.Start()
		servers = append(servers, s)
		logs = append(logs, lg)
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	var urls []string
	for i, s := range servers {
		if !s.ReadyForConnections(30 * time.Second) {
			t.Fatalf("nats-server %d does not accept connections:\n%s", i, logs[i].String())
		}
		urls = append(urls, "tls://"+clients[i])
	}
	e.urls = strings.Join(urls, ",")
	return e
}

// natsLog keeps a test nats-server's warnings and errors, for the failure
// message of a server that did not start.
type natsLog struct{ lockedBuffer }

func (l *natsLog) logf(level, format string, v ...any) {
	fmt.Fprintf(&l.lockedBuffer, level+" "+format+"\n", v...)
}
func (l *natsLog) Noticef(string, ...any)         {}
func (l *natsLog) Debugf(string, ...any)          {}
func (l *natsLog) Tracef(string, ...any)          {}
func (l *natsLog) Warnf(format string, v ...any)  { l.logf("WRN", format, v...) }
func (l *natsLog) Errorf(format string, v ...any) { l.logf("ERR", format, v...) }
func (l *natsLog) Fatalf(format string, v ...any) { l.logf("FTL", format, v...) }

// account makes an account signed by the cluster's operator, its
// JetStream on with limits when js, and makes the servers trust it.
func (e *externalNATS) account(t *testing.T, name string, js bool) nkeys.KeyPair {
	t.Helper()
	kp := mustKP(t, nkeys.CreateAccount)
	if err := e.resolver.Store(mustPub(t, kp), e.accountJWT(t, e.operator, kp, name, js)); err != nil {
		t.Fatal(err)
	}
	return kp
}

// accountJWT is an account's JWT signed by operator.
func (e *externalNATS) accountJWT(t *testing.T, operator, kp nkeys.KeyPair, name string, js bool) string {
	t.Helper()
	ac := jwt.NewAccountClaims(mustPub(t, kp))
	ac.Name = name
	if js {
		// File storage for every bucket and stream of the relay (each
		// replica counts), a little memory, no count limits.
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{DiskStorage: 1 << 30, MemoryStorage: 64 << 20, Streams: -1, Consumer: -1}
	}
	s, err := ac.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// creds writes a .creds file (user JWT and nkey seed) for a new user of
// account, with perms when not nil, and returns its path.
func (e *externalNATS) creds(t *testing.T, account nkeys.KeyPair, name string, perms *jwt.Permissions) string {
	t.Helper()
	user := mustKP(t, nkeys.CreateUser)
	uc := jwt.NewUserClaims(mustPub(t, user))
	uc.Name = name
	if perms != nil {
		uc.Permissions = *perms
	}
	userJWT, err := uc.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.dir, name+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustKP(t *testing.T, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func mustPub(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func splitPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// newCA makes a CA and writes its certificate to dir/file as PEM.
func newCA(t *testing.T, dir, file string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgerelay test NATS CA " + file},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// newLeaf is a server certificate for 127.0.0.1 signed by the CA.
func newLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// externalNode is an edgerelay node (the channel service on, the services
// without a cluster backend off) as a client of the external cluster.
func externalNode(t *testing.T, name string, env ...string) *relayProc {
	t.Helper()
	s := &relayProc{}
	prepare(t, s, append(append([]string(nil), clusterNodeEnv...), append([]string{
		"RELAY_NODE_NAME=" + name, "RELAY_ADMIN_LISTEN=" + freeport.TCP(t), "RELAY_CHANNEL_LISTEN=" + freeport.TCP(t),
	}, env...)...)...)
	return s
}

// waitLogLine polls until one line of a process's log contains every part
// (case-insensitive).
func waitLogLine(t *testing.T, s *relayProc, within time.Duration, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for line := range strings.SplitSeq(strings.ToLower(s.stderr.String()), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, strings.ToLower(p))
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no log line with %q within %s:\n%s", nodeName(s), parts, within, s.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nodeName(s *relayProc) string {
	for _, kv := range s.env {
		if v, ok := strings.CutPrefix(kv, "RELAY_NODE_NAME="); ok {
			return v
		}
	}
	return "?"
}

// adminAddr is a launched node's fixed admin address.
func adminAddr(s *relayProc) string {
	for _, kv := range s.env {
		if v, ok := strings.CutPrefix(kv, "RELAY_ADMIN_LISTEN="); ok {
			return v
		}
	}
	return ""
}

// relayPermissions are the subjects an edgerelay node publishes and
// subscribes to: the JetStream API (streams, consumers, Direct Get), the
// flow control of the ordered consumers behind KV watches, the KV buckets
// (er_*; a subject wildcard matches whole tokens only, so $KV.> or one
// entry per bucket), the mailbox streams' subjects (mbx.<shard>.>) and the
// relay's core subjects (er.>: republished mailbox writes, watch control),
// and the replies to its requests (_INBOX.>).
var relayPermissions = jwt.Permissions{
	Pub: jwt.Permission{Allow: jwt.StringList{"$JS.API.>", "$JS.FC.>", "$KV.>", "mbx.>", "er.>"}},
	Sub: jwt.Permission{Allow: jwt.StringList{"_INBOX.>", "er.>"}},
}

// TestClusterExternalNATSWithTLSAndCreds: two nodes reach an external
// 3-server NATS cluster over tls:// with a .creds file and share one
// channel claim store. A node that cannot get in (the servers' CA not the
// one configured, no credentials, credentials of an account the servers do
// not know or that has no JetStream, a user not allowed the JetStream API)
// serves nothing and says why in its log within seconds, and keeps trying:
// an account the servers learn later lets the waiting node in without a
// restart. A credentials file that is not there is a configuration error:
// serve exits naming it.
func TestClusterExternalNATSWithTLSAndCreds(t *testing.T) {
	e := startExternalNATS(t)
	relay := e.account(t, "RELAY", true)
	// The relay's user is allowed what the README tells an operator to
	// allow, and no more: the nodes below prove it is enough.
	creds := e.creds(t, relay, "relay", &relayPermissions)
	natsEnv := []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_CREDS=" + creds, "RELAY_NATS_TLS_CA=" + e.ca}

	// The nodes that cannot get in (launched once the others serve, which
	// start faster on a loaded machine without them).
	otherCA := t.TempDir()
	newCA(t, otherCA, "other.pem")
	foreignOp := mustKP(t, nkeys.CreateOperator)
	foreignAcc := mustKP(t, nkeys.CreateAccount)
	_ = e.accountJWT(t, foreignOp, foreignAcc, "FOREIGN", true) // valid, but under an operator the servers do not trust
	late := mustKP(t, nkeys.CreateAccount)                      // known to the servers only later
	denied := &jwt.Permissions{Pub: jwt.Permission{Deny: jwt.StringList{"$JS.API.>"}}}
	failing := []struct {
		name string
		env  []string
		why  []string // in one log line
	}{
		{"wrongca", []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_CREDS=" + creds, "RELAY_NATS_TLS_CA=" + filepath.Join(otherCA, "other.pem")},
			[]string{"not reachable yet", "certificate signed by unknown authority"}},
		{"nocreds", []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_TLS_CA=" + e.ca},
			[]string{"not reachable yet", "authorization violation"}},
		{"foreign", []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_CREDS=" + e.creds(t, foreignAcc, "foreign", nil), "RELAY_NATS_TLS_CA=" + e.ca},
			[]string{"not reachable yet", "authorization violation"}},
		{"nojs", []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_CREDS=" + e.creds(t, e.account(t, "NOJS", false), "nojs", nil), "RELAY_NATS_TLS_CA=" + e.ca},
			[]string{"not reachable yet", "jetstream not enabled"}},
		{"denied", []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_CREDS=" + e.creds(t, relay, "denied", denied), "RELAY_NATS_TLS_CA=" + e.ca},
			[]string{"not reachable yet", "permissions violation", "$JS.API."}},
		{"late", []string{"RELAY_NATS_URL=" + e.urls, "RELAY_NATS_CREDS=" + e.creds(t, late, "late", nil), "RELAY_NATS_TLS_CA=" + e.ca},
			[]string{"not reachable yet", "authorization violation"}},
	}

	var nodes []*relayProc
	var started []<-chan string
	for i := range 2 {
		s := externalNode(t, fmt.Sprintf("node%d", i), natsEnv...)
		nodes = append(nodes, s)
		started = append(started, s.launch())
	}
	for i, s := range nodes {
		s.awaitStart(started[i])
		waitReadyz(t, s, http.StatusOK, 20*time.Second)
	}
	var waiting []*relayProc
	var waitingOut []<-chan string
	for _, f := range failing {
		s := externalNode(t, f.name, f.env...)
		waitingOut = append(waitingOut, s.launch())
		waiting = append(waiting, s)
	}

	// A claim key added through node 0's admin is claimed through node 1
	// once, and is taken when claimed again through node 0.
	adminEnv := []string{"RELAY_DATA_DIR=" + nodes[0].dataDir, "RELAY_ADMIN_LISTEN=" + nodes[0].addrs["admin"], "RELAY_NATS_URL=" + e.urls}
	key := lastLine(cliOK(t, adminEnv, "keys", "channel", "add", "--host", "box"))
	claim := func(s *relayProc) int {
		body := fmt.Sprintf(`{"ownerToken":%q,"phoneToken":%q}`, randHex(t), randHex(t))
		req, _ := http.NewRequest("POST", "http://"+s.addrs["channel"]+"/claim", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := freshClient(nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := claim(nodes[1]); code != http.StatusOK {
		t.Fatalf("claim through node 1 of a key added through node 0: %d, want 200", code)
	}
	if code := claim(nodes[0]); code != http.StatusConflict {
		t.Fatalf("second claim through node 0: %d, want 409", code)
	}
	for i, s := range nodes {
		if log := strings.ToLower(s.stderr.String()); strings.Contains(log, "violation") {
			t.Fatalf("node %d was refused something with relayPermissions:\n%s", i, s.stderr.String())
		}
	}

	// No credentials file where configured: refused at once.
	gone := append(append(cleanEnv(), clusterNodeEnv...), "RELAY_DATA_DIR="+t.TempDir(), "RELAY_NODE_NAME=gone",
		"RELAY_ADMIN_LISTEN=127.0.0.1:0", "RELAY_TURN_LISTEN=", "RELAY_NATS_URL="+e.urls,
		"RELAY_NATS_CREDS="+filepath.Join(e.dir, "absent.creds"), "RELAY_NATS_TLS_CA="+e.ca)
	if _, stderr, code := edgerelay(t, gone, "serve"); code != 1 || !strings.Contains(stderr, "absent.creds: no such file") {
		t.Fatalf("serve with a credentials file that is not there: exit %d, want 1 naming the file:\n%s", code, stderr)
	}

	// The failing nodes: each says why, keeps running, never serves.
	for i, s := range waiting {
		waitLogLine(t, s, 15*time.Second, failing[i].why...)
		select {
		case <-s.exited:
			t.Fatalf("%s exited instead of retrying:\n%s", failing[i].name, s.stderr.String())
		default:
		}
		if conn, err := net.DialTimeout("tcp", adminAddr(s), 200*time.Millisecond); err == nil {
			conn.Close()
			t.Fatalf("%s opened its admin listener without its cluster", failing[i].name)
		}
	}

	// The operator adds the late account: its node gets in without a
	// restart (nats.go gives up after the same authorization error twice
	// unless told not to).
	lateNode := waiting[len(waiting)-1]
	if err := e.resolver.Store(mustPub(t, late), e.accountJWT(t, e.operator, late, "LATE", true)); err != nil {
		t.Fatal(err)
	}
	waitLogLine(t, lateNode, 20*time.Second, "cluster store reachable")
	lateNode.awaitStart(waitingOut[len(waitingOut)-1])
	waitReadyz(t, lateNode, http.StatusOK, 20*time.Second)
}
