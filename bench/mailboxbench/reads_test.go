package mailboxbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgerelay/store"
)

func TestCompareReadsSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	rep, err := CompareReads(ctx, ReadOptions{Rounds: 3, RoundTime: 100 * time.Millisecond, Conns: 2,
		Mailboxes: 4, Stored: 5, EnvelopeSize: 300, DataDir: t.TempDir(), Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if len(rep.Figures) != kindCount || rep.Figures[kindHead].Name != kindNames[kindHead] || rep.Figures[kindGet].Name != kindNames[kindGet] ||
		rep.Figures[kindHeadEnvelope].Name != kindNames[kindHeadEnvelope] {
		t.Fatalf("figures %+v, want every kind in order", rep.Figures)
	}
	for _, f := range rep.Figures {
		if len(f.Ours) != 2 || len(f.Baseline) != 2 || f.OursMedian <= 0 || f.BaselineMedian <= 0 ||
			f.Ratio != f.OursMedian/f.BaselineMedian || f.RoundRatio <= 0 {
			t.Errorf("implausible figure %+v", f)
		}
	}
	// Three rounds of every kind per side.
	if got, want := strings.Count(out.String(), "\n"), 3*kindCount*2; got != want {
		t.Errorf("%d progress lines, want %d", got, want)
	}
}

func TestCompareReadsRefusesBadOptions(t *testing.T) {
	for _, o := range []ReadOptions{{Rounds: 1}, {Conns: 8, Mailboxes: 4}, {EnvelopeSize: 10}} {
		if _, err := CompareReads(context.Background(), o); err == nil {
			t.Errorf("no error for %+v", o)
		}
	}
}

// BenchmarkRead sends b.N requests of each kind to each relay over
// loopback, eight connections with one request in flight each. allocs/op
// counts the whole process: server and load generator.
func BenchmarkRead(b *testing.B) {
	o, err := ReadOptions{}.withDefaults()
	if err != nil {
		b.Fatal(err)
	}
	rig, err := newReadRig(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := rig.close(); err != nil {
			b.Error(err)
		}
	}()
	for kind, slug := range kindSlugs {
		for side, name := range [2]string{"ours", "baseline"} {
			b.Run(slug+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				rate, err := loadN(context.Background(), b.N, o.Conns, func(w int) func() error { return rig.op(side, kind, w) })
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(rate, "requests/s")
			})
		}
	}
}

// step is one request of the script both relays must answer alike.
type step struct {
	method, path, token string
	body                []byte
	header              []string // name, value, ...
	// want is the status, then, for 200s and errors, what follows.
	want string
}

// TestRelaysAnswerAlike runs one script of requests, good and bad,
// against our relay and the baseline, each over a store of its own: a
// baseline that answered differently would not be doing the same work.
func TestRelaysAnswerAlike(t *testing.T) {
	const other = "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
	mb := mailboxPath(0)
	env1, env2 := envelope(nil, 1, 100), envelope(nil, 2, 100)
	changed := bytes.Clone(env1)
	changed[50]++
	script := []step{
		{"HEAD", mb + "/p2c", token, nil, nil, "404"},
		{"GET", mb + "/p2c/1", token, nil, nil, `404 {"error":"not_found","status":404}`},
		{"PUT", mb, token, nil, nil, "201"},
		{"PUT", mb, token, nil, nil, "204"},
		{"PUT", mb, other, nil, nil, `409 {"error":"taken","status":409}`},
		{"HEAD", mb + "/p2c", token, nil, nil, "200 0 0 0"},
		{"HEAD", mb + "/p2c", other, nil, nil, "403"},
		{"HEAD", mb + "/p2c", "", nil, nil, "401"},
		{"HEAD", mb + "/x2y", token, nil, nil, "404"},
		{"PUT", mb + "/p2c/1", token, env1, nil, "201"},
		{"PUT", mb + "/p2c/1", token, env1, nil, "200"},
		{"PUT", mb + "/p2c/1", token, changed, nil, `409 {"error":"conflict","status":409}`},
		{"PUT", mb + "/p2c/3", token, env2, nil, `400 {"error":"bad_request","status":400}`},
		{"PUT", mb + "/p2c/2", token, env2[:24], nil, `400 {"error":"bad_request","status":400}`},
		{"PUT", mb + "/p2c/2", token, make([]byte, 65537), nil, `413 {"error":"too_large","status":413}`},
		{"PUT", mb + "/p2c/2", token, env2, []string{"X-Relay-Notify", "loud"}, `400 {"error":"bad_request","status":400}`},
		{"PUT", mb + "/p2c/01", token, env1, nil, `400 {"error":"bad_request","status":400}`},
		{"PUT", mb + "/p2c/2", token, env2, []string{"X-Relay-Notify", "silent"}, "201"},
		{"HEAD", mb + "/p2c", token, nil, nil, "200 1 2 2"},
		{"HEAD", mb + "/c2p", token, nil, nil, "200 0 0 0"},
		{"GET", mb + "/p2c/2", token, nil, nil, fmt.Sprintf("200 application/octet-stream %x", env2)},
		{"HEAD", mb + "/p2c/2", token, nil, nil, "200"},
		{"HEAD", mb + "/p2c/3", token, nil, nil, "404"},
		{"GET", mb + "/p2c/0", token, nil, nil, `400 {"error":"bad_request","status":400}`},
	}
	for _, impl := range []string{"ours", "baseline"} {
		t.Run(impl, func(t *testing.T) {
			r := startForTest(t, impl)
			for i, s := range script {
				if got := r.send(t, s); got != s.want {
					t.Errorf("step %d, %s %s: got %.200s, want %.200s", i, s.method, s.path, got, s.want)
				}
			}
			// A watcher gets what is stored, then what arrives, and
			// answers ping.
			d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, Subprotocols: []string{"zerobyte.v1"}}
			c, resp, err := d.Dial("ws://"+r.addr+mb+"/p2c/watch?after=1", http.Header{"Authorization": {"Bearer " + token}})
			if err != nil {
				t.Fatalf("watch: %v %v", err, resp)
			}
			defer c.Close()
			if p := resp.Header.Get("Sec-WebSocket-Protocol"); p != "zerobyte.v1" {
				t.Errorf("subprotocol %q", p)
			}
			expectFrame(t, c, websocket.BinaryMessage, env2)
			env3 := envelope(nil, 3, 100)
			if got := r.send(t, step{"PUT", mb + "/p2c/3", token, env3, nil, ""}); got != "201" {
				t.Fatalf("PUT 3 beside a watcher: %s", got)
			}
			expectFrame(t, c, websocket.BinaryMessage, env3)
			if err := c.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
				t.Fatal(err)
			}
			expectFrame(t, c, websocket.TextMessage, []byte("pong"))
		})
	}
}

func expectFrame(t *testing.T, c *websocket.Conn, op int, want []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	gotOp, got, err := c.ReadMessage()
	if err != nil || gotOp != op || !bytes.Equal(got, want) {
		t.Fatalf("watch read %d %.40q %v, want %d %.40q", gotOp, got, err, op, want)
	}
}

// startForTest serves one relay over a store of its own until the test ends.
func startForTest(t *testing.T, impl string) *relay {
	t.Helper()
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	log := store.NewEnvelopeLog(db)
	clock := newStepClock()
	var r *relay
	if impl == "ours" {
		r, _, err = startOurs(loopback, log, clock.Now, 0)
	} else {
		r, _, err = startBaseline(loopback, log, clock.Now)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.close(); err != nil {
			t.Error(err)
		}
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// send makes one request and sums up the answer as the script writes it.
func (r *relay) send(t *testing.T, s step) string {
	t.Helper()
	req, err := http.NewRequest(s.method, "http://"+r.addr+s.path, bytes.NewReader(s.body))
	if err != nil {
		t.Fatal(err)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	for i := 0; i+1 < len(s.header); i += 2 {
		req.Header.Set(s.header[i], s.header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(resp.StatusCode)
	switch {
	case s.method == "HEAD" && resp.StatusCode == 200 && resp.Header.Get("X-Relay-Count") != "":
		got += fmt.Sprintf(" %s %s %s", resp.Header.Get("X-Relay-First"), resp.Header.Get("X-Relay-Last"), resp.Header.Get("X-Relay-Count"))
	case s.method == "GET" && resp.StatusCode == 200:
		got += fmt.Sprintf(" %s %x", resp.Header.Get("Content-Type"), body)
	case resp.StatusCode >= 400 && len(body) > 0:
		if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Cache-Control") != "no-store" {
			got += " (error without its JSON headers)"
		}
		got += " " + string(body)
	}
	return got
}
