package config_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgerelay/cmd/edgerelay/config"
)

// load is Load with the help output discarded; it fails the test on error.
func load(t *testing.T, args, environ []string) *config.Values {
	t.Helper()
	v, err := config.Load(args, environ, nil)
	if err != nil {
		t.Fatalf("Load(%q, %q): %v", args, environ, err)
	}
	return v
}

func loadConfig(t *testing.T, args, environ []string) config.Config {
	t.Helper()
	c, err := load(t, args, environ).Config()
	if err != nil {
		t.Fatalf("Config(): %v", err)
	}
	return c
}

// writeFile writes a config file into a fresh directory and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edgerelay.conf")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

func TestDefaults(t *testing.T) {
	v := load(t, nil, nil)
	for _, s := range config.All() {
		if got := v.String(s.Env); got != s.Default {
			t.Errorf("%s = %q, want default %q", s.Env, got, s.Default)
		}
		if v.IsSet(s.Env) || v.Source(s.Env) != config.SourceDefault {
			t.Errorf("%s: IsSet %v, Source %v with nothing given", s.Env, v.IsSet(s.Env), v.Source(s.Env))
		}
	}
	if v.File() != "" {
		t.Errorf("File() = %q with no config file", v.File())
	}

	c, err := v.Config()
	if err != nil {
		t.Fatal(err)
	}
	// The names and defaults DESIGN.md fixes.
	wantListen := map[config.Service]string{
		config.Mailbox:  "127.0.0.1:8080",
		config.Channel:  "127.0.0.1:8081",
		config.PushFCM:  "127.0.0.1:8082",
		config.PushAPNs: "127.0.0.1:8083",
		config.Agent:    "127.0.0.1:8443",
		config.TURN:     "127.0.0.1:3478",
	}
	for s, addr := range wantListen {
		l := c.Listeners[s]
		if l.Addr != addr || !l.On() || l.TLS() {
			t.Errorf("%s listener = %+v, want plain on %s", s, l, addr)
		}
	}
	if len(c.Listeners) != len(config.Services()) {
		t.Errorf("%d listeners, want one per service", len(c.Listeners))
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"DataDir", c.DataDir, "./data"},
		{"AdminListen", c.AdminListen, "127.0.0.1:9090"},
		{"LogLevel", c.LogLevel, slog.LevelInfo},
		{"DrainTimeout", c.DrainTimeout, 10 * time.Second},
		{"Limits", c.Limits, config.Limits{
			MaxConns: 10000, MaxConnsPerIP: 1000, AcceptRate: 1000, AcceptBurst: 2000,
			HeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 8192,
			ParkSockets: true,
		}},
		{"Mailbox", c.Mailbox, config.MailboxConfig{
			Idle: 720 * time.Hour, MaxEnvelope: 65536, MaxStored: 4096, MaxStoredBytes: 32 << 20, EnvelopeCache: 32 << 20,
		}},
		{"TURN.Realm", c.TURN.Realm, "edgerelay"},
		{"TURN.Secret", c.TURN.Secret.Reveal(), ""},
		{"TURN.RelayIP", c.TURN.RelayIP, netip.Addr{}},
		{"TURN.AllowPeers", len(c.TURN.AllowPeers), 0},
		{"APNs.Environment", c.APNs.Environment, "production"},
		{"Gateway", c.Gateway, config.GatewayConfig{RatePerMinute: 10}},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestEnvOverridesDefault(t *testing.T) {
	v := load(t, nil, []string{
		"RELAY_MAILBOX_LISTEN=0.0.0.0:18080",
		"RELAY_IDLE=48h",
		"RELAY_PUSH_REGISTRATION=true",
		"RELAY_MAX_CONNS=7",
		"PATH=/usr/bin", // not ours: ignored
	})
	if got := v.String("RELAY_MAILBOX_LISTEN"); got != "0.0.0.0:18080" {
		t.Errorf("RELAY_MAILBOX_LISTEN = %q", got)
	}
	if got := v.Duration("RELAY_IDLE"); got != 48*time.Hour {
		t.Errorf("RELAY_IDLE = %v", got)
	}
	if !v.Bool("RELAY_PUSH_REGISTRATION") {
		t.Error("RELAY_PUSH_REGISTRATION = false")
	}
	if got := v.Int("RELAY_MAX_CONNS"); got != 7 {
		t.Errorf("RELAY_MAX_CONNS = %d", got)
	}
	if v.Source("RELAY_IDLE") != config.SourceEnv || !v.IsSet("RELAY_IDLE") {
		t.Errorf("RELAY_IDLE source %v", v.Source("RELAY_IDLE"))
	}
	if v.IsSet("RELAY_CHANNEL_LISTEN") {
		t.Error("RELAY_CHANNEL_LISTEN set though only the mailbox was given")
	}
}

func TestEnvLastWins(t *testing.T) {
	v := load(t, nil, []string{"RELAY_TURN_REALM=a", "RELAY_TURN_REALM=b"})
	if got := v.String("RELAY_TURN_REALM"); got != "b" {
		t.Errorf("RELAY_TURN_REALM = %q, want the last one, b", got)
	}
}

func TestFlagOverridesEnv(t *testing.T) {
	v := load(t,
		[]string{"--mailbox-listen", "127.0.0.1:1", "-turn-realm=flagrealm", "--max-stored=9"},
		[]string{"RELAY_MAILBOX_LISTEN=127.0.0.1:2", "RELAY_TURN_REALM=envrealm", "RELAY_CHANNEL_LISTEN=127.0.0.1:3"})
	for env, want := range map[string]string{
		"RELAY_MAILBOX_LISTEN": "127.0.0.1:1",
		"RELAY_TURN_REALM":     "flagrealm",
		"RELAY_MAX_STORED":     "9",
		"RELAY_CHANNEL_LISTEN": "127.0.0.1:3", // no flag: the environment stands
	} {
		if got := v.String(env); got != want {
			t.Errorf("%s = %q, want %q", env, got, want)
		}
	}
	if v.Source("RELAY_MAILBOX_LISTEN") != config.SourceFlag {
		t.Errorf("RELAY_MAILBOX_LISTEN source %v, want flag", v.Source("RELAY_MAILBOX_LISTEN"))
	}
}

func TestBoolFlagForms(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--push-registration"}, true},
		{[]string{"--push-registration=true"}, true},
		{[]string{"--push-registration=0"}, false},
	} {
		v := load(t, tc.args, []string{"RELAY_PUSH_REGISTRATION=false"})
		if got := v.Bool("RELAY_PUSH_REGISTRATION"); got != tc.want {
			t.Errorf("%q: RELAY_PUSH_REGISTRATION = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestConfigFileLayers(t *testing.T) {
	path := writeFile(t, `
# a production box
RELAY_DATA_DIR=/var/lib/edgerelay
RELAY_TURN_REALM=filerealm
RELAY_MAX_CONNS=5
`)
	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
	}{
		{"flag", []string{"--config", path}, nil},
		{"env", nil, []string{"RELAY_CONFIG=" + path}},
		// The flag names the file even when the environment names another.
		{"flag over env", []string{"--config=" + path}, []string{"RELAY_CONFIG=/nonexistent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			environ := append(tc.environ, "RELAY_TURN_REALM=envrealm")
			args := append(tc.args, "--max-conns=6")
			v := load(t, args, environ)
			if v.File() != path {
				t.Errorf("File() = %q, want %q", v.File(), path)
			}
			for env, want := range map[string]string{
				"RELAY_DATA_DIR":   "/var/lib/edgerelay", // file over default
				"RELAY_TURN_REALM": "envrealm",           // env over file
				"RELAY_MAX_CONNS":  "6",                  // flag over file
			} {
				if got := v.String(env); got != want {
					t.Errorf("%s = %q, want %q", env, got, want)
				}
			}
			if v.Source("RELAY_DATA_DIR") != config.SourceFile {
				t.Errorf("RELAY_DATA_DIR source %v, want config file", v.Source("RELAY_DATA_DIR"))
			}
		})
	}
}

func TestConfigFileFormat(t *testing.T) {
	path := writeFile(t, "# comment\r\n"+
		"\n"+
		"   # indented comment\n"+
		"RELAY_APPS=\"notes;chat:push=com.example.chat,signal,ice\"\n"+
		"turn-secret = 's3#cret with spaces'\n"+ // flag name; '#' inside a value is kept
		"  apns-url  =  https://apns.test:8443  \r\n"+
		"RELAY_TURN_LISTEN=\n") // empty: TURN off
	v := load(t, []string{"--config", path}, nil)
	for env, want := range map[string]string{
		"RELAY_APPS":        "notes;chat:push=com.example.chat,signal,ice",
		"RELAY_TURN_SECRET": "s3#cret with spaces",
		"RELAY_APNS_URL":    "https://apns.test:8443",
		"RELAY_TURN_LISTEN": "",
	} {
		if got := v.String(env); got != want {
			t.Errorf("%s = %q, want %q", env, got, want)
		}
	}
	if !v.IsSet("RELAY_TURN_LISTEN") {
		t.Error("RELAY_TURN_LISTEN= in the file is not IsSet")
	}
}

func TestConfigFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          []string
	}{
		{"unknown env name", "RELAY_DATA_DIR=/x\n\nRELAY_MAILBOX_LISTN=:1\n", []string{":3:", `"RELAY_MAILBOX_LISTN"`, "unknown setting"}},
		{"unknown flag name", "# x\nmailbox-listn = :1\n", []string{":2:", `"mailbox-listn"`}},
		{"no equals", "RELAY_DATA_DIR\n", []string{":1:", "RELAY_NAME=value"}},
		{"duplicate", "RELAY_IDLE=1h\nidle=2h\n", []string{":2:", "RELAY_IDLE", "line 1"}},
		{"nested config", "RELAY_CONFIG=/etc/other\n", []string{":1:", "another config file"}},
		{"bad value", "\nRELAY_MAX_STORED=lots\n", []string{":2:", "RELAY_MAX_STORED", `"lots"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.content)
			_, err := config.Load([]string{"--config", path}, nil, nil)
			wantErr(t, err, append(tc.want, path)...)
		})
	}

	t.Run("missing file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope.conf")
		_, err := config.Load(nil, []string{"RELAY_CONFIG=" + missing}, nil)
		wantErr(t, err, missing)
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("error %v does not wrap os.ErrNotExist", err)
		}
	})

	// A bad value in the file is reported even when the environment
	// overrides it: the file is wrong and will bite once the env is gone.
	t.Run("bad value overridden", func(t *testing.T) {
		path := writeFile(t, "RELAY_IDLE=forever\n")
		_, err := config.Load([]string{"--config", path}, []string{"RELAY_IDLE=1h"}, nil)
		wantErr(t, err, "RELAY_IDLE", `"forever"`)
	})
}

func TestUnknownFlag(t *testing.T) {
	_, err := config.Load([]string{"--mailbox-listn=:1"}, nil, nil)
	wantErr(t, err, "mailbox-listn", "--help")

	_, err = config.Load([]string{"stray"}, nil, nil)
	wantErr(t, err, `"stray"`)

	// A bool flag does not swallow the next argument.
	_, err = config.Load([]string{"--push-registration", "false"}, nil, nil)
	wantErr(t, err, `"false"`)
}

func TestBadValues(t *testing.T) {
	for _, tc := range []struct{ env, value string }{
		{"RELAY_MAX_CONNS", "many"},
		{"RELAY_MAX_CONNS", "0"},
		{"RELAY_MAX_CONNS_PER_IP", "-1"},
		{"RELAY_MAX_HEADER_BYTES", "8k"},
		{"RELAY_PUSH_DAILY_BUDGET", "-1"},
		{"RELAY_PUSH_DAILY_BUDGET", "lots"},
		{"RELAY_PUSH_REGISTRATION", "yes"},
		{"RELAY_PUSH_REGISTRATION", ""},
		{"RELAY_IDLE", "30d"},
		{"RELAY_IDLE", "720"},
		{"RELAY_IDLE", "0s"},
		{"RELAY_DRAIN_TIMEOUT", "-5s"},
		{"RELAY_HEADER_TIMEOUT", ""},
		{"RELAY_MAILBOX_LISTEN", "8080"},
		{"RELAY_MAILBOX_LISTEN", "127.0.0.1:http"},
		{"RELAY_TURN_LISTEN", "127.0.0.1:70000"},
		{"RELAY_TURN_RELAY_IP", "relay.example.com"},
		{"RELAY_TURN_ALLOW_PEERS", "10.0.0.0/8,nonsense"},
		{"RELAY_TURN_ALLOW_PEERS", "10.0.0.0/8,,10.1.0.0/16"},
		{"RELAY_APNS_URL", "apns.test"},
		{"RELAY_FCM_URL", "ftp://fcm.test"},
		{"RELAY_LOG_LEVEL", "loud"},
	} {
		flagName := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(tc.env, "RELAY_")), "_", "-")
		_, err := config.Load(nil, []string{tc.env + "=" + tc.value}, nil)
		wantErr(t, err, tc.env, fmt.Sprintf("%q", tc.value), "environment")

		_, err = config.Load([]string{"--" + flagName + "=" + tc.value}, nil, nil)
		wantErr(t, err, tc.env, fmt.Sprintf("%q", tc.value), "--"+flagName)
	}
}

func TestGoodValues(t *testing.T) {
	v := load(t, nil, []string{
		"RELAY_MAILBOX_LISTEN=:8080",
		"RELAY_CHANNEL_LISTEN=[::1]:0",
		"RELAY_AGENT_LISTEN=localhost:443",
		"RELAY_TURN_RELAY_IP=2001:db8::1",
		"RELAY_TURN_ALLOW_PEERS=10.1.2.3/16, 192.168.5.7 ,fd00::/8",
		"RELAY_LOG_LEVEL=debug",
		"RELAY_PUSH_DAILY_BUDGET=0",
		"RELAY_CF_URL=http://127.0.0.1:9999/v1",
	})
	c, err := v.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.TURN.RelayIP != netip.MustParseAddr("2001:db8::1") {
		t.Errorf("RelayIP = %v", c.TURN.RelayIP)
	}
	wantPeers := []netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("192.168.5.7/32"),
		netip.MustParsePrefix("fd00::/8"),
	}
	if fmt.Sprint(c.TURN.AllowPeers) != fmt.Sprint(wantPeers) {
		t.Errorf("AllowPeers = %v, want %v", c.TURN.AllowPeers, wantPeers)
	}
	if c.LogLevel != slog.LevelDebug {
		t.Errorf("LogLevel = %v", c.LogLevel)
	}
	if c.Listeners[config.Channel].Addr != "[::1]:0" {
		t.Errorf("channel = %q", c.Listeners[config.Channel].Addr)
	}
}

func TestDailyBudget(t *testing.T) {
	for _, tc := range []struct {
		environ     []string
		wantBudget  int
		wantMetered bool
	}{
		{nil, 0, false},
		{[]string{"RELAY_PUSH_DAILY_BUDGET="}, 0, false},
		{[]string{"RELAY_PUSH_DAILY_BUDGET=0"}, 0, true}, // 0 closes the gateway
		{[]string{"RELAY_PUSH_DAILY_BUDGET=500"}, 500, true},
	} {
		c := loadConfig(t, nil, tc.environ)
		if c.Gateway.DailyBudget != tc.wantBudget || c.Gateway.Metered != tc.wantMetered {
			t.Errorf("%q: budget %d metered %v, want %d %v", tc.environ,
				c.Gateway.DailyBudget, c.Gateway.Metered, tc.wantBudget, tc.wantMetered)
		}
	}
}

// An empty listen address turns a service off, from any layer, and is told
// apart from an address that was never given.
func TestEmptyListenMeansOff(t *testing.T) {
	offFile := writeFile(t, "RELAY_TURN_LISTEN=\n")
	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
	}{
		{"env", nil, []string{"RELAY_TURN_LISTEN="}},
		{"flag", []string{"--turn-listen="}, nil},
		{"flag with separate empty argument", []string{"--turn-listen", ""}, nil},
		{"file", []string{"--config", offFile}, nil},
		{"flag over env", []string{"--turn-listen="}, []string{"RELAY_TURN_LISTEN=127.0.0.1:3478"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := load(t, tc.args, tc.environ)
			if !v.IsSet("RELAY_TURN_LISTEN") || v.String("RELAY_TURN_LISTEN") != "" {
				t.Fatalf("RELAY_TURN_LISTEN: IsSet %v, value %q; want set and empty",
					v.IsSet("RELAY_TURN_LISTEN"), v.String("RELAY_TURN_LISTEN"))
			}
			c, err := v.Config()
			if err != nil {
				t.Fatal(err)
			}
			if c.Listeners[config.TURN].On() {
				t.Errorf("TURN on at %q", c.Listeners[config.TURN].Addr)
			}
			if !c.Listeners[config.Mailbox].On() {
				t.Error("mailbox turned off too")
			}
		})
	}

	v := load(t, nil, nil)
	if v.IsSet("RELAY_TURN_LISTEN") || !loadConfig(t, nil, nil).Listeners[config.TURN].On() {
		t.Error("with nothing given, TURN is not on its default address")
	}

	// The admin listener too; and an off service needs no realm.
	c := loadConfig(t, nil, []string{"RELAY_ADMIN_LISTEN=", "RELAY_TURN_LISTEN=", "RELAY_TURN_REALM="})
	if c.AdminListen != "" {
		t.Errorf("AdminListen = %q, want off", c.AdminListen)
	}
}

func TestTLSResolution(t *testing.T) {
	c := loadConfig(t, nil, []string{
		"RELAY_TLS_CERT=/tls/all.crt", "RELAY_TLS_KEY=/tls/all.key",
		"RELAY_AGENT_TLS_CERT=/tls/agent.crt", "RELAY_AGENT_TLS_KEY=/tls/agent.key",
		"RELAY_CHANNEL_TLS_CERT=", // opts the channel out of the shared certificate
	})
	want := map[config.Service][2]string{
		config.Mailbox:  {"/tls/all.crt", "/tls/all.key"},
		config.Channel:  {"", ""},
		config.PushFCM:  {"/tls/all.crt", "/tls/all.key"},
		config.PushAPNs: {"/tls/all.crt", "/tls/all.key"},
		config.Agent:    {"/tls/agent.crt", "/tls/agent.key"},
		config.TURN:     {"/tls/all.crt", "/tls/all.key"},
	}
	for s, files := range want {
		l := c.Listeners[s]
		if l.CertFile != files[0] || l.KeyFile != files[1] || l.TLS() != (files[0] != "") {
			t.Errorf("%s: %+v, want %q", s, l, files)
		}
	}

	// Without a shared certificate, only the service that has one is TLS.
	c = loadConfig(t, []string{"--mailbox-tls-cert=/m.crt", "--mailbox-tls-key=/m.key"}, nil)
	if !c.Listeners[config.Mailbox].TLS() || c.Listeners[config.Channel].TLS() {
		t.Errorf("mailbox %+v, channel %+v", c.Listeners[config.Mailbox], c.Listeners[config.Channel])
	}

	for _, environ := range [][]string{
		{"RELAY_TLS_CERT=/a.crt"},
		{"RELAY_TLS_KEY=/a.key"},
		{"RELAY_TURN_TLS_CERT=/t.crt"},
		{"RELAY_TLS_CERT=/a.crt", "RELAY_TLS_KEY=/a.key", "RELAY_PUSH_FCM_TLS_KEY=/f.key"},
	} {
		_, err := load(t, nil, environ).Config()
		wantErr(t, err, "set both or neither")
	}
}

func TestConfigReportsEveryProblem(t *testing.T) {
	_, err := load(t, nil, []string{"RELAY_DATA_DIR=", "RELAY_TURN_REALM=", "RELAY_TLS_CERT=/x"}).Config()
	wantErr(t, err, "RELAY_DATA_DIR", "RELAY_TURN_REALM", "RELAY_TLS_CERT")
}

func TestUnknownEnv(t *testing.T) {
	v := load(t, nil, []string{"RELAY_MAILBOX_LISTN=:1", "RELAY_ZZZ=1", "RELAY_ZZZ=2", "HOME=/root", "RELAY_IDLE=1h"})
	got := v.UnknownEnv()
	if fmt.Sprint(got) != "[RELAY_MAILBOX_LISTN RELAY_ZZZ]" {
		t.Errorf("UnknownEnv() = %q", got)
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		var out bytes.Buffer
		v, err := config.Load([]string{"--turn-realm=x", arg}, nil, &out)
		if !errors.Is(err, flag.ErrHelp) || v != nil {
			t.Fatalf("Load(%s) = %v, %v; want nil, flag.ErrHelp", arg, v, err)
		}
		help := out.String()
		if !strings.HasPrefix(help, "Usage: edgerelay serve") {
			t.Errorf("help starts %q", help[:min(len(help), 40)])
		}
		for _, s := range config.All() {
			if !strings.Contains(help, "--"+s.Flag+" ") && !strings.Contains(help, "--"+s.Flag+"  ") {
				t.Errorf("%s: help lacks flag --%s", arg, s.Flag)
			}
			if !strings.Contains(help, "("+s.Env) {
				t.Errorf("%s: help lacks %s", arg, s.Env)
			}
			if s.Default != "" && !strings.Contains(help, "("+s.Env+", default "+s.Default+")") {
				t.Errorf("%s: help lacks the default of %s", arg, s.Env)
			}
		}
	}
}

func TestSecretsNotPrinted(t *testing.T) {
	const turn, cf = "turn-secret-value-1f2e", "cf-token-value-9a8b"
	v := load(t, []string{"--cf-turn-api-token=" + cf}, []string{"RELAY_TURN_SECRET=" + turn})
	c, err := v.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.TURN.Secret.Reveal() != turn || c.Cloudflare.APIToken.Reveal() != cf {
		t.Fatal("Reveal does not return the secrets")
	}

	var outputs []string
	var buf bytes.Buffer
	config.Usage(&buf)
	config.MarkdownTable(&buf)
	outputs = append(outputs, buf.String())
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outputs = append(outputs,
			fmt.Sprintf(verb, c), fmt.Sprintf(verb, c.TURN), fmt.Sprintf(verb, c.TURN.Secret))
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(js))
	var logs bytes.Buffer
	for _, h := range []slog.Handler{slog.NewJSONHandler(&logs, nil), slog.NewTextHandler(&logs, nil)} {
		slog.New(h).Info("start", "config", c, "settings", v, "secret", c.Cloudflare.APIToken)
	}
	outputs = append(outputs, logs.String())

	for _, out := range outputs {
		for _, secret := range []string{turn, cf, fmt.Sprintf("%x", turn)} {
			if strings.Contains(out, secret) {
				t.Errorf("output shows a secret:\n%s", out)
			}
		}
	}
	if !strings.Contains(logs.String(), "[redacted]") {
		t.Errorf("logs do not say the secret is set:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "RELAY_CF_TURN_API_TOKEN") {
		t.Errorf("Values.LogValue does not list the settings that were set:\n%s", logs.String())
	}
	if s := fmt.Sprint(config.Secret("")); s != "" {
		t.Errorf("empty secret prints %q", s)
	}
}

func TestMarkdownTable(t *testing.T) {
	var buf bytes.Buffer
	config.MarkdownTable(&buf)
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if lines[0] != "| env | flag | default | meaning |" || lines[1] != "|---|---|---|---|" {
		t.Fatalf("header:\n%s\n%s", lines[0], lines[1])
	}
	rows := lines[2:]
	all := config.All()
	if len(rows) != len(all) {
		t.Fatalf("%d rows, want one per setting (%d)", len(rows), len(all))
	}
	for i, s := range all {
		prefix := fmt.Sprintf("| `%s` | `--%s` | ", s.Env, s.Flag)
		if !strings.HasPrefix(rows[i], prefix) {
			t.Errorf("row %d = %q, want prefix %q", i, rows[i], prefix)
		}
		// Four cells: an unescaped '|' in a help text would make more.
		if n := strings.Count(rows[i], "|") - strings.Count(rows[i], `\|`); n != 5 {
			t.Errorf("row %d has %d cell borders, want 5: %q", i, n, rows[i])
		}
		if s.Default != "" && !strings.Contains(rows[i], "| `"+s.Default+"` |") {
			t.Errorf("row %d lacks default %q", i, s.Default)
		}
	}
}

// The table itself: names unique and derived as documented, groups in
// order, every default valid for its kind, secrets without defaults.
func TestSettingsTable(t *testing.T) {
	all := config.All()
	envs, flags := map[string]bool{}, map[string]bool{}
	groupOrder := map[config.Group]int{}
	for i, g := range config.Groups() {
		groupOrder[g] = i
	}
	last := -1
	for _, s := range all {
		if envs[s.Env] {
			t.Errorf("two settings named %s", s.Env)
		}
		if flags[s.Flag] {
			t.Errorf("two settings with flag --%s", s.Flag)
		}
		envs[s.Env], flags[s.Flag] = true, true

		if !strings.HasPrefix(s.Env, "RELAY_") || strings.ToUpper(s.Env) != s.Env {
			t.Errorf("%s: not an upper-case RELAY_ name", s.Env)
		}
		if want := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.Env, "RELAY_")), "_", "-"); s.Flag != want {
			t.Errorf("%s: flag %q, want %q", s.Env, s.Flag, want)
		}
		if s.Flag == "h" || s.Flag == "help" {
			t.Errorf("%s: flag shadows --help", s.Env)
		}
		if s.Help == "" {
			t.Errorf("%s: no help", s.Env)
		}
		if s.Secret && s.Default != "" {
			t.Errorf("%s: a secret with a default", s.Env)
		}
		g, ok := groupOrder[s.Group]
		if !ok {
			t.Errorf("%s: unknown group %q", s.Env, s.Group)
		}
		if g < last {
			t.Errorf("%s: group %q out of order", s.Env, s.Group)
		}
		last = g
	}
	// Every service has its listen address and TLS pair.
	for _, svc := range config.Services() {
		for _, env := range []string{svc.ListenEnv(), svc.TLSCertEnv(), svc.TLSKeyEnv()} {
			if !envs[env] {
				t.Errorf("service %s lacks setting %s", svc, env)
			}
		}
	}
	// The settings DESIGN.md names, and the limits the brief asks for.
	for _, env := range []string{
		"RELAY_DATA_DIR", "RELAY_ADMIN_LISTEN", "RELAY_TURN_SECRET", "RELAY_TURN_REALM",
		"RELAY_TURN_RELAY_IP", "RELAY_TURN_ALLOW_PEERS", "RELAY_APPS", "RELAY_IDLE",
		"RELAY_APNS_KEY_FILE", "RELAY_APNS_KEY_ID", "RELAY_APNS_TEAM_ID", "RELAY_APNS_TOPIC",
		"RELAY_APNS_ENVIRONMENT", "RELAY_APNS_URL", "RELAY_FCM_CREDENTIALS", "RELAY_FCM_URL",
		"RELAY_PUSH_REGISTRATION", "RELAY_PUSH_RATE_PER_MINUTE", "RELAY_PUSH_DAILY_BUDGET",
		"RELAY_TRUSTED_PROXY_HEADER", "RELAY_CF_TURN_KEY_ID", "RELAY_CF_TURN_API_TOKEN",
		"RELAY_CF_URL", "RELAY_TLS_CERT", "RELAY_TLS_KEY", "RELAY_MAX_CONNS",
		"RELAY_MAX_CONNS_PER_IP", "RELAY_ACCEPT_RATE", "RELAY_ACCEPT_BURST",
		"RELAY_HEADER_TIMEOUT", "RELAY_IDLE_TIMEOUT", "RELAY_MAX_HEADER_BYTES",
		"RELAY_DRAIN_TIMEOUT", "RELAY_LOG_LEVEL", "RELAY_MAX_STORED", "RELAY_CONFIG",
	} {
		if !envs[env] {
			t.Errorf("missing setting %s", env)
		}
	}
	// Admin is plain HTTP: no TLS settings.
	if envs["RELAY_ADMIN_TLS_CERT"] || envs["RELAY_ADMIN_TLS_KEY"] {
		t.Error("admin listener has TLS settings")
	}
	// Secrets are exactly these.
	for _, s := range all {
		want := s.Env == "RELAY_TURN_SECRET" || s.Env == "RELAY_CF_TURN_API_TOKEN"
		if s.Secret != want {
			t.Errorf("%s: Secret = %v", s.Env, s.Secret)
		}
	}
	// All returns a fresh slice each time.
	all[0].Env = "CHANGED"
	if config.All()[0].Env == "CHANGED" {
		t.Error("All shares its slice")
	}
}

func TestAccessorMisuse(t *testing.T) {
	v := load(t, nil, nil)
	for name, f := range map[string]func(){
		"unknown name":   func() { v.String("RELAY_NOPE") },
		"Int on string":  func() { v.Int("RELAY_DATA_DIR") },
		"Bool on int":    func() { v.Bool("RELAY_MAX_CONNS") },
		"Duration on ip": func() { v.Duration("RELAY_TURN_RELAY_IP") },
		"Int on opt int": func() { v.Int("RELAY_PUSH_DAILY_BUDGET") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func ExampleLoad() {
	v, err := config.Load(
		[]string{"--mailbox-listen=0.0.0.0:8080"},
		[]string{"RELAY_TURN_LISTEN=", "RELAY_IDLE=168h"}, // normally os.Environ()
		os.Stdout)
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := v.Config()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range config.Services() {
		if l := c.Listeners[s]; l.On() {
			fmt.Printf("%s on %s\n", s, l.Addr)
		} else {
			fmt.Printf("%s off (%s is empty)\n", s, s.ListenEnv())
		}
	}
	fmt.Println("idle expiry", c.Mailbox.Idle)
	// Output:
	// mailbox on 0.0.0.0:8080
	// channel on 127.0.0.1:8081
	// push-fcm on 127.0.0.1:8082
	// push-apns on 127.0.0.1:8083
	// agent on 127.0.0.1:8443
	// turn off (RELAY_TURN_LISTEN is empty)
	// idle expiry 168h0m0s
}

// TestCORSOrigins: RELAY_CORS_ORIGINS is off by default, normalized to
// the form browsers send, and a value that is no list of origins (a
// path, * among others, null) refuses to start with the reason.
func TestCORSOrigins(t *testing.T) {
	if c := loadConfig(t, nil, nil); c.CORS.On() {
		t.Fatalf("CORS on by default: %q", c.CORS)
	}
	for in, want := range map[string]string{
		"*": "*",
		"https://App.example.com:443, http://localhost:3000": "https://app.example.com,http://localhost:3000",
	} {
		if c := loadConfig(t, []string{"--cors-origins=" + in}, nil); c.CORS.String() != want {
			t.Errorf("--cors-origins=%q: %q, want %q", in, c.CORS, want)
		}
	}
	for in, says := range map[string]string{
		"https://app.example.com/":            "has a path",
		"https://app.example.com/app":         "has a path",
		"*,https://app.example.com":           "cannot be mixed",
		"null":                                "refused",
		"app.example.com":                     "scheme://host",
		"https://a.example,https://*.example": "wildcard",
	} {
		_, err := load(t, nil, []string{"RELAY_CORS_ORIGINS=" + in}).Config()
		wantErr(t, err, "RELAY_CORS_ORIGINS", says)
	}
}

// TestACMEResolution: RELAY_ACME_DOMAINS stands in for RELAY_TLS_CERT on
// every listener; a listener's own certificate setting set empty keeps it
// out; names are checked, lower-cased and deduplicated.
func TestACMEResolution(t *testing.T) {
	c := loadConfig(t, nil, []string{
		"RELAY_ACME_DOMAINS=Relay.Example.com, push.example.com,relay.example.com",
		"RELAY_CHANNEL_TLS_CERT=", // out: plain
		"RELAY_AGENT_TLS_KEY=",    // out: the development certificate
	})
	if want := []string{"relay.example.com", "push.example.com"}; fmt.Sprint(c.ACME.Domains) != fmt.Sprint(want) {
		t.Errorf("domains %q, want %q", c.ACME.Domains, want)
	}
	if !c.ACME.On() || c.ACME.Directory != config.DefaultACMEDirectory || c.ACME.HTTPListen != "" || c.ACME.Email != "" || c.ACME.CAFile != "" {
		t.Errorf("ACME %+v", c.ACME)
	}
	want := map[config.Service]bool{config.Mailbox: true, config.Channel: false, config.PushFCM: true, config.PushAPNs: true, config.Agent: false, config.TURN: true}
	for s, acme := range want {
		if l := c.Listeners[s]; l.ACME != acme || l.TLS() {
			t.Errorf("%s: %+v, want ACME %v and no file", s, l, acme)
		}
	}

	c = loadConfig(t, nil, nil)
	if c.ACME.On() {
		t.Errorf("ACME on by default: %+v", c.ACME)
	}
	for _, s := range config.Services() {
		if c.Listeners[s].ACME {
			t.Errorf("%s takes ACME by default", s)
		}
	}
	// Set empty, the domains turn ACME off, and the other settings may stay.
	c = loadConfig(t, nil, []string{"RELAY_ACME_DOMAINS=", "RELAY_ACME_HTTP_LISTEN=:80"})
	if c.ACME.On() || c.Listeners[config.Mailbox].ACME {
		t.Errorf("RELAY_ACME_DOMAINS= left ACME on: %+v", c.ACME)
	}
	c = loadConfig(t, []string{"--acme-domains=relay.example.com", "--acme-http-listen=:80", "--acme-email=ops@example.com",
		"--acme-directory=https://acme-staging-v02.api.letsencrypt.org/directory", "--acme-ca=/ca.pem"}, nil)
	if c.ACME.HTTPListen != ":80" || c.ACME.Email != "ops@example.com" || c.ACME.CAFile != "/ca.pem" ||
		c.ACME.Directory != "https://acme-staging-v02.api.letsencrypt.org/directory" {
		t.Errorf("ACME from flags: %+v", c.ACME)
	}
}

func TestACMERefusals(t *testing.T) {
	for _, c := range []struct {
		environ []string
		want    []string
	}{
		{[]string{"RELAY_ACME_DOMAINS=relay.example.com", "RELAY_AGENT_TLS_CERT=/a.crt", "RELAY_AGENT_TLS_KEY=/a.key"},
			[]string{"RELAY_ACME_DOMAINS and RELAY_AGENT_TLS_CERT both give the agent listener its certificate", "RELAY_AGENT_TLS_CERT= empty keeps"}},
		{[]string{"RELAY_ACME_DOMAINS=relay.example.com", "RELAY_TLS_CERT=/a.crt", "RELAY_TLS_KEY=/a.key", "RELAY_MAILBOX_TLS_CERT=", "RELAY_MAILBOX_TLS_KEY="},
			[]string{"RELAY_ACME_DOMAINS and RELAY_TLS_CERT both give the channel, push-fcm, push-apns, agent, turn listeners their certificate"}},
		{[]string{"RELAY_ACME_DOMAINS=relay.example.com", "RELAY_ACME_DIRECTORY="}, []string{"RELAY_ACME_DIRECTORY is empty while RELAY_ACME_DOMAINS is set"}},
		{[]string{"RELAY_ACME_EMAIL=ops@example.com", "RELAY_ACME_CA=/ca.pem"}, []string{"RELAY_ACME_EMAIL, RELAY_ACME_CA apply to RELAY_ACME_DOMAINS, which is not set"}},
		{[]string{"RELAY_ACME_DIRECTORY=https://ca.example/dir"}, []string{"RELAY_ACME_DIRECTORY apply to RELAY_ACME_DOMAINS"}},
		{[]string{"RELAY_ACME_DOMAINS=relay.example.com", "RELAY_MAILBOX_LISTEN=", "RELAY_CHANNEL_LISTEN=", "RELAY_PUSH_FCM_LISTEN=", "RELAY_PUSH_APNS_LISTEN=", "RELAY_TURN_LISTEN=", "RELAY_AGENT_TLS_CERT="},
			[]string{"RELAY_ACME_DOMAINS is set but no listener takes its certificates"}},
	} {
		_, err := load(t, nil, c.environ).Config()
		wantErr(t, err, c.want...)
	}
	// A domain the CA cannot validate, each with its reason; the valid
	// ones beside it do not hide it.
	for domain, reason := range map[string]string{
		"localhost":                              "has one label",
		"*.example.com":                          "is a wildcard",
		"relay.example.com:443":                  "is not a host name",
		"192.0.2.1":                              "is not a host name",
		"::1":                                    "is not a host name",
		"relay_1.example.com":                    "is not a DNS name",
		"-relay.example.com":                     "is not a DNS name",
		"relay..example.com":                     "is not a DNS name",
		"r\u00e9lay.example.com":                 "is not a DNS name",
		strings.Repeat("a", 64) + ".example.com": "is not a DNS name",
		strings.Repeat("a.", 127) + "com":        "is longer than 253 characters",
	} {
		_, err := load(t, nil, []string{"RELAY_ACME_DOMAINS=relay.example.com," + domain}).Config()
		wantErr(t, err, fmt.Sprintf("RELAY_ACME_DOMAINS: %q %s", domain, reason))
	}
	// At the limits: a 63-character label, a 253-character name.
	long := strings.Repeat("a", 63) + ".example.com"
	name253 := strings.Repeat("a.", 125) + "com"
	c := loadConfig(t, nil, []string{"RELAY_ACME_DOMAINS=" + long + "," + name253 + ",xn--rlay-bpa.example.com"})
	if len(c.ACME.Domains) != 3 || len(name253) != 253 {
		t.Errorf("domains %q", c.ACME.Domains)
	}
}
