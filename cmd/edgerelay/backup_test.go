package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/agent/agenttest"
	"edgerelay/store"
)

// ackedEnvelope is one write the relay acknowledged, and when the answer
// was in hand.
type ackedEnvelope struct {
	writer int
	seq    uint64
	body   []byte
	at     time.Time
}

// backupWriters stream PUTs into their own mailboxes until stop closes and
// record every 201 with its time.
type backupWriters struct {
	mu     sync.Mutex
	acked  []ackedEnvelope
	tokens []string
	wg     sync.WaitGroup
	stop   chan struct{}
	once   sync.Once
}

func backupMailbox(w int) string { return fmt.Sprintf("/v1/notes/mailbox/backup-mailbox-%04d", w) }

func startBackupWriters(t *testing.T, base string, n int) *backupWriters {
	t.Helper()
	bw := &backupWriters{stop: make(chan struct{})}
	t.Cleanup(func() { bw.halt() })
	for w := range n {
		tok := fmt.Sprintf("backup-writer-token-%04d-0123456789", w)
		bw.tokens = append(bw.tokens, tok)
		if code := mailboxDo(t, "PUT", base+backupMailbox(w), tok, nil); code != 201 {
			t.Fatalf("claim %d: %d", w, code)
		}
	}
	for w := range n {
		bw.wg.Add(1)
		go func() {
			defer bw.wg.Done()
			client := &http.Client{Timeout: 5 * time.Second}
			for seq := uint64(1); ; {
				select {
				case <-bw.stop:
					return
				default:
				}
				body := sealedLike(seq, w, 0)
				copy(body[9+40:], fmt.Sprintf("backup-marker-%d-%d", w, seq))
				req, _ := http.NewRequest("PUT", fmt.Sprintf("%s%s/p2c/%d", base, backupMailbox(w), seq), bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+bw.tokens[w])
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("writer %d seq %d: %v", w, seq, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 201:
					at := time.Now()
					bw.mu.Lock()
					bw.acked = append(bw.acked, ackedEnvelope{writer: w, seq: seq, body: body, at: at})
					bw.mu.Unlock()
					seq++
				case 429: // the write bucket: the same sequence again, a little later
					time.Sleep(20 * time.Millisecond)
				default:
					t.Errorf("writer %d seq %d: %d", w, seq, resp.StatusCode)
					return
				}
			}
		}()
	}
	return bw
}

func (bw *backupWriters) count() int {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	return len(bw.acked)
}

// halt stops the writers and returns what was acknowledged; a cleanup
// calls it too, so that a failed test stops them before the server goes.
func (bw *backupWriters) halt() []ackedEnvelope {
	bw.once.Do(func() { close(bw.stop) })
	bw.wg.Wait()
	bw.mu.Lock()
	defer bw.mu.Unlock()
	return bw.acked
}

// secrets of every service, minted on the first server, that the backup
// must hold only as digests (or sealed).
type backupSecrets struct {
	mailboxToken, claimKey, clientToken, openPairKey, instanceToken, instanceID, apiKey, deviceToken string
}

// TestBackupOnlineDuringWritesAndRestore takes a backup through the
// running server while writers stream acknowledged envelopes, restores it
// into a fresh data dir and checks that a new server serves all of it:
// every envelope acknowledged before the backup was asked for (GET bytes
// equal), the mailbox claim, channel claim keys, agent accounts and
// instances (the instance's token still dials in), push gateway keys. The
// backup holds no secret in the clear. Along the way: a non-empty DIR, and
// a restore into the running server's data dir, are refused.
func TestBackupOnlineDuringWritesAndRestore(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_APPS=notes;chat:push=com.example.chat"}
	s := startServer(t, env...)
	adminEnv := append(env, "RELAY_ADMIN_LISTEN="+s.addrs["admin"])
	sec := mintBackupSecrets(t, s, adminEnv)

	bw := startBackupWriters(t, s.origin("mailbox"), 4)
	waitUntil(t, func() bool { return bw.count() >= 200 })

	// A DIR that holds anything is refused, and kept as it was.
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "keep.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := edgerelay(t, adminEnv, "backup", full); code != 1 || !strings.Contains(errOut, "is not empty") {
		t.Fatalf("backup into a full dir: exit %d\n%s%s", code, out, errOut)
	}
	if raw, err := os.ReadFile(filepath.Join(full, "keep.txt")); err != nil || string(raw) != "mine" {
		t.Fatalf("the full dir's file: %q %v", raw, err)
	}

	backup := filepath.Join(t.TempDir(), "backup")
	asked := time.Now()
	out := cliOK(t, adminEnv, "backup", backup)
	if !regexpLine(out, `^backup of \S+ written by the running server to `+regexpQuote(backup)+`: store format 1, \d+ files, \d+ bytes$`) {
		t.Fatalf("backup output:\n%s", out)
	}
	// The writers go on a little past the backup, then stop.
	after := bw.count()
	waitUntil(t, func() bool { return bw.count() >= after+20 })
	acked := bw.halt()

	// A restore into the running server's data dir: its store is locked.
	if out, errOut, code := edgerelay(t, env, "restore", backup); code != 1 || !strings.Contains(errOut, "a server is running on this data dir") {
		t.Fatalf("restore into the running server's data dir: exit %d\n%s%s", code, out, errOut)
	}

	checkNoSecretInBackup(t, backup, sec, acked[0])

	// A fresh data dir with the old relay key, as the usage text asks.
	fresh := t.TempDir()
	copyFileTo(t, filepath.Join(dir, agent.KeyFile), filepath.Join(fresh, agent.KeyFile))
	freshEnv := []string{"RELAY_DATA_DIR=" + fresh, "RELAY_APPS=notes;chat:push=com.example.chat"}
	out = cliOK(t, freshEnv, "restore", backup)
	if !regexpLine(out, `^restored `+regexpQuote(backup)+` into `+regexpQuote(filepath.Join(fresh, "pebble"))+`: store format 1, \d+ files, \d+ bytes$`) {
		t.Fatalf("restore output:\n%s", out)
	}
	s.kill()
	r := startServer(t, freshEnv...)
	base := r.origin("mailbox")
	before := 0
	for _, e := range acked {
		if !e.at.Before(asked) {
			continue
		}
		before++
		got, code := mailboxGet(t, fmt.Sprintf("%s%s/p2c/%d", base, backupMailbox(e.writer), e.seq), bw.tokens[e.writer])
		if code != 200 || !bytes.Equal(got, e.body) {
			t.Fatalf("writer %d seq %d acknowledged before the backup, restored: %d", e.writer, e.seq, code)
		}
	}
	if before < 200 {
		t.Fatalf("only %d envelopes acknowledged before the backup", before)
	}
	checkRestoredServices(t, r, append(freshEnv, "RELAY_ADMIN_LISTEN="+r.addrs["admin"]), sec)
}

// mintBackupSecrets puts a record of every service into the running
// server: a mailbox claim and a sealed push registration, a channel claim
// key, an agent account with a paired instance and an open pairing key,
// a push gateway key.
func mintBackupSecrets(t *testing.T, s *relayProc, adminEnv []string) backupSecrets {
	t.Helper()
	sec := backupSecrets{mailboxToken: "backup-claim-token-0123456789", deviceToken: strings.Repeat("cd", 32)}
	chat := s.origin("mailbox") + "/v1/chat/mailbox/backup-push-mailbox"
	if code := mailboxDo(t, "PUT", chat, sec.mailboxToken, nil); code != 201 {
		t.Fatalf("claim: %d", code)
	}
	reg := []byte(`{"service":"apns","token":"` + sec.deviceToken + `","environment":"production","tag":"backupTag"}`)
	if code := mailboxDo(t, "PUT", chat+"/p2c/push", sec.mailboxToken, reg); code != 204 {
		t.Fatalf("push registration: %d", code)
	}
	sec.claimKey = lastLine(cliOK(t, adminEnv, "keys", "channel", "add", "--host", "backup-host"))
	sec.clientToken = lastLine(cliOK(t, adminEnv, "keys", "agent", "account", "add", "backup-account"))
	pairKey := lastLine(cliOK(t, adminEnv, "keys", "agent", "pair-key", "backup-account"))
	sec.openPairKey = lastLine(cliOK(t, adminEnv, "keys", "agent", "pair-key", "backup-account"))
	redeemed := redeemPairKey(t, agentClient(t, s.dataDir), "https://"+s.addrs["agent"], pairKey, "backup-box")
	sec.instanceToken, sec.instanceID = redeemed.InstanceToken, redeemed.InstanceID
	sec.apiKey = lastLine(cliOK(t, adminEnv, "keys", "push", "create", "--label", "backup-label"))
	return sec
}

func agentClient(t *testing.T, dataDir string) *http.Client {
	t.Helper()
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: devCA(t, dataDir), MinVersion: tls.VersionTLS13}}}
}

func devCA(t *testing.T, dataDir string) *x509.CertPool {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return pool
}

// checkNoSecretInBackup reads every byte of the backup: none of the
// secrets is there, while an envelope written before it is (the bytes are
// readable as stored, so an absent secret is really absent).
func checkNoSecretInBackup(t *testing.T, backup string, sec backupSecrets, first ackedEnvelope) {
	t.Helper()
	var all []byte
	entries, err := os.ReadDir(backup)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(backup, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, raw...)
	}
	if !bytes.Contains(all, first.body) {
		t.Fatal("the backup's bytes do not show a stored envelope: the search below would prove nothing")
	}
	for name, secret := range map[string]string{
		"mailbox token": sec.mailboxToken, "device token": sec.deviceToken, "claim key": sec.claimKey,
		"client token": sec.clientToken, "pairing key": sec.openPairKey, "instance token": sec.instanceToken,
		"push API key": sec.apiKey, "registration tag": "backupTag",
	} {
		if len(secret) < 8 {
			t.Fatalf("%s %q: too short to search for", name, secret)
		}
		if bytes.Contains(all, []byte(secret)) {
			t.Fatalf("the backup holds the %s in the clear", name)
		}
	}
}

// checkRestoredServices asks the restored server for the records of every
// service that mintBackupSecrets made.
func checkRestoredServices(t *testing.T, r *relayProc, adminEnv []string, sec backupSecrets) {
	t.Helper()
	chat := r.origin("mailbox") + "/v1/chat/mailbox/backup-push-mailbox"
	if code := mailboxDo(t, "PUT", chat, sec.mailboxToken, nil); code != 204 {
		t.Fatalf("claim by its owner after restore: %d", code)
	}
	if code := mailboxDo(t, "PUT", chat, "another-token-0123456789abc", nil); code != 409 {
		t.Fatalf("claim by another token after restore: %d", code)
	}
	if out := cliOK(t, adminEnv, "keys", "channel", "list"); !regexpLine(out, `^backup-host\s+false\s+false\s+false\s`) {
		t.Fatalf("channel keys after restore:\n%s", out)
	}
	if out := cliOK(t, adminEnv, "keys", "agent", "account", "list"); !strings.Contains(out, "backup-account") {
		t.Fatalf("agent accounts after restore:\n%s", out)
	}
	if out := cliOK(t, adminEnv, "keys", "agent", "instance", "list"); !regexpLine(out, regexpQuote(sec.instanceID)+`\s+backup-box\s+backup-account\s+false\s`) {
		t.Fatalf("agent instances after restore:\n%s", out)
	}
	if out := cliOK(t, adminEnv, "keys", "push", "list"); !strings.Contains(out, "backup-label") {
		t.Fatalf("push keys after restore:\n%s", out)
	}
	// The instance's token (kept as its digest) still opens the link, and
	// the welcome verifies against the relay key brought along.
	relayKey := lastLine(cliOK(t, adminEnv, "keys", "agent", "relay-key"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := agenttest.Dial(ctx, agenttest.Options{
		Addr: r.addrs["agent"], ServerName: "127.0.0.1", RootCAs: devCA(t, r.dataDir),
		Token: sec.instanceToken, Instance: sec.instanceID, RelayKey: relayKey,
		HeartbeatEvery: time.Second, HeartbeatTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatalf("the restored instance dials in: %v", err)
	}
	conn.Close()
}

// TestBackupOfflineAndRestore backs up a data dir no server runs on, and
// restores it into another, where the key commands find the records.
func TestBackupOfflineAndRestore(t *testing.T) {
	env := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_ADMIN_LISTEN=127.0.0.1:1"}
	cliOK(t, env, "keys", "channel", "add", "--host", "offline-host")
	cliOK(t, env, "keys", "agent", "account", "add", "offline-account")
	backup := filepath.Join(t.TempDir(), "backup")
	// A relative DIR is the caller's.
	cmdDir := filepath.Dir(backup)
	out, errOut, code := edgerelayIn(t, cmdDir, env, "backup", "backup")
	if code != 0 || !regexpLine(out, `^backup of \S+ written by this command \(no server running\) to `+regexpQuote(backup)+`: store format 1, \d+ files, \d+ bytes$`) {
		t.Fatalf("offline backup: exit %d\n%s%s", code, out, errOut)
	}
	fresh := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_ADMIN_LISTEN=127.0.0.1:1"}
	cliOK(t, fresh, "restore", backup)
	if out := cliOK(t, fresh, "keys", "channel", "list"); !regexpLine(out, `^offline-host\s+false\s`) {
		t.Fatalf("channel keys:\n%s", out)
	}
	if out := cliOK(t, fresh, "keys", "agent", "account", "list"); !strings.Contains(out, "offline-account") {
		t.Fatalf("accounts:\n%s", out)
	}
	// A second restore: the data dir holds a store now.
	if out, errOut, code := edgerelay(t, fresh, "restore", backup); code != 1 || !strings.Contains(errOut, "the data dir holds a store already") {
		t.Fatalf("restore over a store: exit %d\n%s%s", code, out, errOut)
	}
	if out := cliOK(t, nil, "backup", "--help"); !strings.Contains(out, "byte copy of the store") || !strings.Contains(out, "SHA-256 digests") {
		t.Fatalf("usage:\n%s", out)
	}
	if _, errOut, code := edgerelay(t, env, "backup"); code != 2 || !strings.Contains(errOut, "missing the directory") {
		t.Fatalf("no DIR: %d %s", code, errOut)
	}
}

// TestBackupRestoreRefuseANewerStore: a backup whose store says format 2
// is refused by restore, and a data dir holding one by the commands and
// the server, untouched.
func TestBackupRestoreRefuseANewerStore(t *testing.T) {
	env := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_ADMIN_LISTEN=127.0.0.1:1"}
	cliOK(t, env, "keys", "channel", "add", "--host", "newer-host")
	backup := filepath.Join(t.TempDir(), "backup")
	cliOK(t, env, "backup", backup)
	setStoreVersion(t, backup, store.Version+1)
	const refusal = "store format 2 is newer than this binary's 1: run a binary of that version or newer"
	fresh := t.TempDir()
	if out, errOut, code := edgerelay(t, []string{"RELAY_DATA_DIR=" + fresh}, "restore", backup); code != 1 || !strings.Contains(errOut, refusal) {
		t.Fatalf("restore of a newer backup: exit %d\n%s%s", code, out, errOut)
	}
	if entries, _ := os.ReadDir(fresh); len(entries) != 0 {
		t.Fatalf("the refused restore left %v", entries)
	}
	// The same store as a data dir: refused by a key command and by serve.
	data := t.TempDir()
	if err := os.Rename(backup, filepath.Join(data, "pebble")); err != nil {
		t.Fatal(err)
	}
	dataEnv := []string{"RELAY_DATA_DIR=" + data, "RELAY_ADMIN_LISTEN=127.0.0.1:1"}
	if out, errOut, code := edgerelay(t, dataEnv, "keys", "channel", "list"); code != 1 || !strings.Contains(errOut, refusal) {
		t.Fatalf("keys on a newer store: exit %d\n%s%s", code, out, errOut)
	}
	s := &relayProc{}
	prepare(t, s, dataEnv...)
	out, errOut, code := edgerelayIn(t, t.TempDir(), s.env, "serve")
	if code == 0 || !strings.Contains(out+errOut, refusal) {
		t.Fatalf("serve on a newer store: exit %d\n%s%s", code, out, errOut)
	}
}

// setStoreVersion writes the format version record of a closed Pebble
// directory, as a newer binary would have.
func setStoreVersion(t *testing.T, dir string, v uint64) {
	t.Helper()
	pdb, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pdb.Set([]byte("\x00v"), binary.BigEndian.AppendUint64(nil, v), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := pdb.Close(); err != nil {
		t.Fatal(err)
	}
}

// quietPebble keeps Pebble's start-up chatter out of the test output.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// edgerelayIn is edgerelay run in the working directory wd, killed if it
// runs past a deadline (serve refusing a store must exit by itself).
func edgerelayIn(t *testing.T, wd string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binaryPath, args...)
	cmd.Dir, cmd.Env = wd, append(cleanEnv(), env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("edgerelay %s still running after 20 s", strings.Join(args, " "))
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

func copyFileTo(t *testing.T, src, dst string) {
	t.Helper()
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

func regexpQuote(s string) string { return regexp.QuoteMeta(s) }
