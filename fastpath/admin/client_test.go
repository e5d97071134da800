package admin

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCallWithoutServerIsErrNoServer(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	// No token file: no server runs on this data dir.
	if err := Call("127.0.0.1:1", tokenFile, "GET", "/x", nil, 200, nil); !errors.Is(err, ErrNoServer) {
		t.Fatalf("no token file: %v", err)
	}
	// A token left by a killed server, nothing listening.
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := Call(addr, tokenFile, "GET", "/x", nil, 200, nil); !errors.Is(err, ErrNoServer) {
		t.Fatalf("nothing listening: %v", err)
	}
}

func TestCallSendsTokenAndBodyAndReadsAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, 64)
		n, _ := r.Body.Read(body)
		switch {
		case r.Header.Get("Authorization") != "Bearer tok":
			w.WriteHeader(401)
			_, _ = w.Write([]byte(`{"error":"unauthorized"}`))
		case r.URL.Path != "/v1/keys/x" || string(body[:n]) != `{"label":"a"}`:
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"error":"bad request"}`))
		default:
			w.WriteHeader(201)
			_, _ = w.Write([]byte(`{"id":"k1"}`))
		}
	}))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	var out struct{ ID string }
	if err := Call(addr, tokenFile, "POST", "/v1/keys/x", map[string]string{"label": "a"}, 201, &out); err != nil || out.ID != "k1" {
		t.Fatalf("call: %v, %+v", err, out)
	}
	err := Call(addr, tokenFile, "POST", "/v1/keys/y", map[string]string{"label": "a"}, 201, nil)
	if err == nil || !strings.Contains(err.Error(), "relay answered 400: bad request") || errors.Is(err, ErrNoServer) {
		t.Fatalf("refused call: %v", err)
	}
}
