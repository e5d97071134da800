package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// ErrNoServer means no server answered: there is no admin token (no
// server runs on this data dir), or nothing listens where it should. The
// command line then opens the store directly.
var ErrNoServer = errors.New("no running server")

// ClusterOffline is the error of a key command that found no running node
// while the settings say cluster mode: the keys live in the cluster's
// store, not in this data dir's, so the command never falls back to it.
func ClusterOffline(adminAddr string) error {
	return fmt.Errorf("cluster mode: no node answered at %s; the keys are kept in the cluster, so run this against a running node's admin listener (--admin-listen, and that node's --data-dir for its admin token)", adminAddr)
}

// Call sends one request to the running server's admin listener at addr,
// with the admin token read from tokenFile: body (when not nil) as JSON,
// the answer (when out is not nil) decoded from JSON. An answer other
// than want is an error carrying the relay's {"error":…} message.
func Call(addr, tokenFile, method, path string, body any, want int, out any) error {
	return CallWithin(10*time.Second, addr, tokenFile, method, path, body, want, out)
}

// CallWithin is Call with the time the whole request may take: a backup
// copies the store when the backup directory is on another filesystem.
func CallWithin(timeout time.Duration, addr, tokenFile, method, path string, body any, want int, out any) error {
	if addr == "" || tokenFile == "" {
		return ErrNoServer
	}
	tok, err := os.ReadFile(tokenFile)
	if errors.Is(err, os.ErrNotExist) {
		return ErrNoServer
	}
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("admin request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, rd)
	if err != nil {
		return fmt.Errorf("admin request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	client := &http.Client{Timeout: timeout}
	resp, err := client.Do(req)
	if err != nil {
		// A stale token file from a server that was killed: nothing listens.
		return fmt.Errorf("%w: %v", ErrNoServer, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("admin answer: %w", err)
	}
	if resp.StatusCode != want {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		return fmt.Errorf("relay answered %d: %s", resp.StatusCode, e.Error)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("admin answer: %w", err)
		}
	}
	return nil
}
