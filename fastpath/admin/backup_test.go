package admin_test

import (
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// startBackup serves an admin handler whose Backup checkpoints a fresh
// store (db nil: backup off, as in cluster mode).
func startBackup(t *testing.T, withStore bool) string {
	t.Helper()
	cfg := admin.Config{Gatherer: prometheus.NewRegistry(), TokenHash: httpx.Hash([]byte(token)), Log: slog.New(slog.DiscardHandler)}
	if withStore {
		db, err := store.Open(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		cfg.Backup = db.Checkpoint
	}
	a := admin.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: a.ServeHTTP}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func TestBackupEndpoint(t *testing.T) {
	base := startBackup(t, true)
	dir := filepath.Join(t.TempDir(), "backup")
	if code, _ := call(t, "POST", base+admin.BackupPath, "", admin.BackupRequest{Dir: dir}); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	if code, body := call(t, "GET", base+admin.BackupPath, token, nil); code != 405 {
		t.Fatalf("GET: %d %s", code, body)
	}
	if code, body := call(t, "POST", base+admin.BackupPath, token, admin.BackupRequest{Dir: "relative/dir"}); code != 400 || !strings.Contains(string(body), "absolute") {
		t.Fatalf("relative: %d %s", code, body)
	}
	code, body := call(t, "POST", base+admin.BackupPath, token, admin.BackupRequest{Dir: dir})
	var info store.BackupInfo
	if code != 201 || json.Unmarshal(body, &info) != nil || info.Path != dir || info.Version != store.Version || info.Files == 0 || info.Bytes == 0 {
		t.Fatalf("backup: %d %s", code, body)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	// Again into the same, now full, directory: refused, and the answer
	// is valid JSON even with a quote in the path.
	quoted := filepath.Join(t.TempDir(), `a"b`)
	if err := os.MkdirAll(quoted, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(quoted, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, quoted} {
		code, body := call(t, "POST", base+admin.BackupPath, token, admin.BackupRequest{Dir: d})
		var e struct{ Error string }
		if code != 409 || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error, "not empty") || !strings.Contains(e.Error, d) {
			t.Fatalf("non-empty %s: %d %s", d, code, body)
		}
	}
}

func TestBackupEndpointOffWithoutStore(t *testing.T) {
	base := startBackup(t, false)
	code, body := call(t, "POST", base+admin.BackupPath, token, admin.BackupRequest{Dir: filepath.Join(t.TempDir(), "b")})
	if code != 404 || !strings.Contains(string(body), "cluster mode") {
		t.Fatalf("off: %d %s", code, body)
	}
}
