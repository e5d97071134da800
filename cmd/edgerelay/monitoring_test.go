package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"edgerelay/internal/freeport"

	"github.com/fasthttp/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/pion/logging"
	pionturn "github.com/pion/turn/v4"
)

// The shipped monitoring: Prometheus rules and a Grafana dashboard.
var (
	rulesFile     = filepath.Join("..", "..", "deploy", "prometheus", "edgerelay.rules.yml")
	rulesTestFile = filepath.Join("..", "..", "deploy", "prometheus", "edgerelay.rules.test.yml")
	dashboardFile = filepath.Join("..", "..", "deploy", "grafana", "edgerelay.json")
)

// lookTool finds a command of Debian's prometheus package.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s (Debian package prometheus) is not installed: run .ci/install-package.sh prometheus prometheus prometheus promtool", name)
	}
	return bin
}

// TestMonitoringRulesPassPromtool: the rules are valid for Prometheus and
// their unit tests (alerts firing and not firing) pass.
func TestMonitoringRulesPassPromtool(t *testing.T) {
	promtool := lookTool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", rulesTestFile},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPrometheusFindsEverySeriesTheMonitoringNames: a real Prometheus,
// loading the rules, scrapes a single relay under a little load (claims,
// envelopes, a watch, a 429, a TURN allocation with credentials from ice)
// and a one-node cluster relay; then every series that an expression of
// the rules or the dashboard names (found by a tokenizer, not a list kept
// by hand) exists in Prometheus, recording rules' outputs included, and
// every rule loaded healthy.
func TestPrometheusFindsEverySeriesTheMonitoringNames(t *testing.T) {
	prometheus := lookTool(t, "prometheus")
	exprs := monitoringExprs(t)
	names := seriesNames(exprs)
	if len(names) < 30 {
		t.Fatalf("only %d series names found in the rules and the dashboard: the tokenizer lost some\n%v", len(names), names)
	}

	turnAddr := freeport.TCPAndUDP(t)
	single := &relayProc{}
	prepare(t, single, "RELAY_APPS=chat:signal,ice", "RELAY_TURN_LISTEN="+turnAddr,
		"RELAY_TURN_SECRET=monitoring-turn-secret", "RELAY_TURN_ALLOW_PEERS=127.0.0.0/8")
	singleStarted := single.launch()
	node := &relayProc{}
	prepare(t, node, append(append([]string(nil), clusterNodeEnv...),
		"RELAY_NODE_NAME=monitoring", "RELAY_NATS_URL="+startPlainNATS(t), "RELAY_NATS_REPLICAS=1")...)
	node.start()
	single.awaitStart(singleStarted)

	prom := startPrometheus(t, prometheus, map[string]string{
		"edgerelay":         single.addrs["admin"],
		"edgerelay-cluster": node.addrs["admin"],
	})
	monitoringLoad(t, single, turnAddr)

	// Both targets scraped and up.
	waitProm(t, 20*time.Second, "both targets up", func() error {
		res := prom.query(t, `up{job=~"edgerelay.*"} == 1`)
		if len(res) != 2 {
			return fmt.Errorf("%d targets up: %v", len(res), res)
		}
		return nil
	})
	// Every rule of the file loaded, each evaluated without error.
	wantRules := len(regexp.MustCompile(`(?m)^\s*- (record|alert):`).FindAllString(readFile(t, rulesFile), -1))
	waitProm(t, 20*time.Second, "every rule loaded and healthy", func() error {
		return prom.rulesHealthy(t, wantRules)
	})
	// Every series named exists (recording rules have evaluated twice by
	// now at 1 s; a rate needs two scrapes).
	var missing []string
	waitProm(t, 20*time.Second, "every named series exists", func() error {
		missing = missing[:0]
		for _, n := range names {
			if !prom.seriesExists(t, n) {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no series %s", strings.Join(missing, ", "))
		}
		return nil
	})
	// The load moved what it should have.
	for q, want := range map[string]string{
		`sum(edgerelay_mailbox_envelopes_stored_total)`:                  "3",
		`sum(edgerelay_mailbox_rate_limited_total)`:                      "1",
		`sum(edgerelay_turn_allocations_total)`:                          "1",
		`sum(edgerelay_store_commit_seconds_count{job="edgerelay"}) > 3`: "",
		`edgerelay_cluster_nats_connected`:                               "1",
	} {
		waitProm(t, 10*time.Second, q, func() error {
			res := prom.query(t, q)
			if len(res) != 1 || (want != "" && res[0].Value[1] != want) {
				return fmt.Errorf("%s = %v, want %q", q, res, want)
			}
			return nil
		})
	}
}

// startPlainNATS runs one nats-server with JetStream on a free loopback
// port (no TLS, no accounts) for a cluster-mode node, and returns its URL.
func startPlainNATS(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		ServerName: "monitoring", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	lg := &natsLog{}
	s.SetLoggerV2(lg, false, false, false)
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(20 * time.Second) {
		t.Fatalf("nats-server does not accept connections:\n%s", lg.String())
	}
	return s.ClientURL()
}

// monitoringExprs are the PromQL expressions of the rules file (each
// `expr:`, block scalars included) and of the dashboard (every target's
// expr and the template variables' queries).
func monitoringExprs(t *testing.T) []string {
	t.Helper()
	var exprs []string
	lines := strings.Split(readFile(t, rulesFile), "\n")
	for i := 0; i < len(lines); i++ {
		indent, rest, ok := strings.Cut(lines[i], "expr:")
		if !ok || strings.TrimSpace(indent) != "" {
			continue
		}
		rest = strings.TrimSpace(rest)
		if rest != ">-" && rest != "|" && rest != ">" && rest != "|-" {
			exprs = append(exprs, strings.Trim(rest, `'"`))
			continue
		}
		// A block scalar: the lines indented deeper than expr:.
		var block []string
		for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || leading(lines[i+1]) > len(indent)) {
			i++
			block = append(block, lines[i])
		}
		exprs = append(exprs, strings.Join(block, "\n"))
	}

	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	panelExprs := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			panelExprs++
		}
	}
	if panelExprs == 0 {
		t.Fatalf("%s: no panel expressions", dashboardFile)
	}
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_]\w*\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("%s: template query: %v", dashboardFile, err)
		}
		if m := labelValues.FindStringSubmatch(q.Query); m != nil {
			exprs = append(exprs, m[1])
		} else {
			exprs = append(exprs, q.Query)
		}
	}
	return exprs
}

func leading(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// promqlLabelLists are the keywords followed by a parenthesized list of
// label names, not series.
var promqlLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlWords are the keywords, constants and aggregation operators
// (which may be followed by "by (...)" rather than "(") that are not series.
var promqlWords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "atan2": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
}

// seriesNames returns the metric names the expressions select: the
// identifiers that are not functions or aggregations (followed by "("),
// keywords, label names (inside {} or a by/on/... list), strings,
// durations ([...]), numbers or Grafana variables ($x, ${x}).
func seriesNames(exprs []string) []string {
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range exprSeries(e) {
			seen[n] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func exprSeries(e string) []string {
	var out []string
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	nextNonSpace := func(i int) int {
		for i < len(e) && (e[i] == ' ' || e[i] == '\t' || e[i] == '\n' || e[i] == '\r') {
			i++
		}
		return i
	}
	// skipString returns the index after the string literal opened at i.
	skipString := func(i int) int {
		q := e[i]
		for i++; i < len(e); i++ {
			if e[i] == '\\' && q != '`' {
				i++
				continue
			}
			if e[i] == q {
				return i + 1
			}
		}
		return i
	}
	// skipTo returns the index after the close matching the open at i,
	// strings skipped.
	skipTo := func(i int, open, close byte) int {
		depth := 0
		for i < len(e) {
			switch c := e[i]; {
			case c == '"' || c == '\'' || c == '`':
				i = skipString(i)
				continue
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i := 0; i < len(e); {
		c := e[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(i)
		case c == '{':
			i = skipTo(i, '{', '}')
		case c == '[':
			i = skipTo(i, '[', ']')
		case c == '$':
			i++
			if i < len(e) && e[i] == '{' {
				i = skipTo(i, '{', '}')
			}
			for i < len(e) && isPart(e[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(e) && (isPart(e[i]) || e[i] == '.') {
				i++
			}
		case isStart(c):
			j := i
			for j < len(e) && isPart(e[j]) {
				j++
			}
			word := e[i:j]
			k := nextNonSpace(j)
			switch {
			case promqlLabelLists[strings.ToLower(word)]:
				if k < len(e) && e[k] == '(' {
					j = skipTo(k, '(', ')')
				}
			case promqlWords[strings.ToLower(word)]:
			case k < len(e) && e[k] == '(': // a function or an aggregation
			default:
				out = append(out, word)
			}
			i = j
		default:
			i++
		}
	}
	return out
}

// promServer is a Prometheus started by a test.
type promServer struct{ base string }

// startPrometheus runs Prometheus on a free loopback port with the rules
// loaded, scraping each job's one target every second, and waits until it
// is ready.
func startPrometheus(t *testing.T, bin string, jobs map[string]string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	jobNames := make([]string, 0, len(jobs))
	for j := range jobs {
		jobNames = append(jobNames, j)
	}
	sort.Strings(jobNames)
	for _, j := range jobNames {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets: [%q]\n", j, jobs[j])
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeport.TCP(t)
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr, "--log.level=warn")
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	p := &promServer{base: "http://" + addr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", logs.String())
		default:
		}
		if resp, err := http.Get(p.base + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 20 s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// api GETs a Prometheus API path and decodes its data.
func (p *promServer) api(t *testing.T, path string, data any) {
	t.Helper()
	resp, err := http.Get(p.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("prometheus %s: %v", path, err)
	}
	if body.Status != "success" {
		t.Fatalf("prometheus %s: %d %s", path, resp.StatusCode, body.Error)
	}
	if err := json.Unmarshal(body.Data, data); err != nil {
		t.Fatalf("prometheus %s: %v", path, err)
	}
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query; the values come back as strings.
func (p *promServer) query(t *testing.T, q string) []promSample {
	t.Helper()
	var data struct {
		Result []promSample `json:"result"`
	}
	p.api(t, "/api/v1/query?query="+url.QueryEscape(q), &data)
	return data.Result
}

// seriesExists asks the series API whether name has any series.
func (p *promServer) seriesExists(t *testing.T, name string) bool {
	t.Helper()
	var series []map[string]string
	p.api(t, "/api/v1/series?match[]="+url.QueryEscape(name), &series)
	return len(series) > 0
}

// rulesHealthy reports an error unless Prometheus holds want rules and
// every one evaluated without error.
func (p *promServer) rulesHealthy(t *testing.T, want int) error {
	t.Helper()
	var data struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	p.api(t, "/api/v1/rules", &data)
	n := 0
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				return fmt.Errorf("rule %s/%s: health %q %s", g.Name, r.Name, r.Health, r.LastError)
			}
		}
	}
	if n != want {
		return fmt.Errorf("prometheus holds %d rules, the file has %d", n, want)
	}
	return nil
}

func waitProm(t *testing.T, within time.Duration, what string, ok func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := ok()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// monitoringLoad gives the relay a little of everything the dashboard
// shows: a claim, three envelopes, a watch that receives them, a 429 (the
// 7th ice request within the bucket's 6), and a TURN allocation with the
// credentials ice handed out.
func monitoringLoad(t *testing.T, s *relayProc, turnAddr string) {
	t.Helper()
	base := s.origin("mailbox") + "/v1/chat/mailbox/monitoring-mailbox-0001"
	tok := "monitoring-token-0123456789"
	if code := mailboxDo(t, "PUT", base, tok, nil); code != 201 {
		t.Fatalf("claim: %d", code)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if code := mailboxDo(t, "PUT", fmt.Sprintf("%s/p2c/%d", base, seq), tok, sealedLike(seq, 0, 0)); code != 201 {
			t.Fatalf("put %d: %d", seq, code)
		}
	}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second, Subprotocols: []string{"zerobyte.v1", "zerobyte.bearer." + tok}}
	w, _, err := d.Dial("ws"+strings.TrimPrefix(base, "http")+"/p2c/watch", nil)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	_ = w.SetReadDeadline(time.Now().Add(10 * time.Second))
	for range 3 {
		if _, _, err := w.ReadMessage(); err != nil {
			t.Fatalf("watch: %v", err)
		}
	}

	var ice struct {
		ICEServers []struct {
			URLs       []string `json:"urls"`
			Username   string   `json:"username"`
			Credential string   `json:"credential"`
		} `json:"iceServers"`
	}
	for i := 1; i <= 7; i++ {
		raw, code := mailboxGet(t, base+"/ice", tok)
		want := 200
		if i == 7 {
			want = 429
		}
		if code != want {
			t.Fatalf("ice request %d: %d, want %d: %s", i, code, want, raw)
		}
		if i == 1 {
			if err := json.Unmarshal(raw, &ice); err != nil || len(ice.ICEServers) != 2 {
				t.Fatalf("ice: %v %s", err, raw)
			}
		}
	}
	srv := ice.ICEServers[1]
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client, err := pionturn.NewClient(&pionturn.ClientConfig{
		TURNServerAddr: turnAddr, Username: srv.Username, Password: srv.Credential,
		Conn: conn, LoggerFactory: logging.NewDefaultLoggerFactory(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if err := client.Listen(); err != nil {
		t.Fatal(err)
	}
	relayConn, err := client.Allocate()
	if err != nil {
		t.Fatalf("allocate with the ice credentials: %v", err)
	}
	t.Cleanup(func() { relayConn.Close() })
}

// TestMonitoringTokenizerFindsSeriesOnly: functions, aggregations with
// their label lists, matchers, strings, durations, numbers and Grafana
// variables are not series; recording-rule names (with colons) are.
func TestMonitoringTokenizerFindsSeriesOnly(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (job, instance, le) (rate(a_bucket{x="y}", z=~"$i"}[5m])) > 0.1`:                       "a_bucket",
		`max by (job) (b) == 1 and on (job) group_left (c_label) c:rec:rate5m offset 5m`:               "b c:rec:rate5m",
		`label_replace(rate(d_total[$__rate_interval]), "kind", "m_$1", "socket", "(.*)") or e / f`:    "d_total e f",
		`histogram_quantile(0.99, sum(rate(g_bucket[5m])) without (pod)) * 1e3 + count(h) + ${v}`:      "g_bucket h",
		"up{job=~\"edgerelay.*\"} == 0 unless bool\n  process_open_fds / ignoring (x) process_max_fds": "up process_open_fds process_max_fds",
	} {
		if got := strings.Join(exprSeries(expr), " "); got != want {
			t.Errorf("%s: got %q, want %q", expr, got, want)
		}
	}
}
