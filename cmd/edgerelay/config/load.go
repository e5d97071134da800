package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Source says which layer gave a setting its value.
type Source int

const (
	SourceDefault Source = iota // nothing set it: the table's default
	SourceFile                  // the config file
	SourceEnv                   // a RELAY_* environment variable
	SourceFlag                  // a command-line flag
)

func (s Source) String() string {
	switch s {
	case SourceDefault:
		return "default"
	case SourceFile:
		return "config file"
	case SourceEnv:
		return "environment"
	case SourceFlag:
		return "flag"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Values holds the value of every setting after all layers, each checked
// against its kind. It is read-only once Load returns, so it can be shared.
//
// The typed accessors (String, Int, …) take an environment name and panic
// when no setting has that name or when the kind does not match: both are
// mistakes in the program, not in the operator's input, and a test that
// touches the accessor finds them.
type Values struct {
	settings   []Setting
	index      map[string]int // environment name → position in settings and vals
	vals       []value
	file       string   // config file that was read; "" if none
	unknownEnv []string // RELAY_* variables that name no setting, sorted
}

type value struct {
	raw string
	src Source
}

// Load reads every setting: defaults, then the config file (named by
// --config, else by RELAY_CONFIG), then the RELAY_* entries of environ
// ("NAME=value" strings as os.Environ returns them; for a name given twice
// the last wins, as in os/exec), then the flags in args (the arguments after
// "serve"). Every value that is given is checked, whichever layer gives it,
// and the first bad one is reported with its setting, its value and where it
// came from.
//
// On -h or --help, Load writes [Usage] to usage (if not nil) and returns
// flag.ErrHelp, so that the caller can exit 0. Flag errors are returned, not
// printed: the caller prints the error once, without a wall of help after it.
func Load(args, environ []string, usage io.Writer) (*Values, error) {
	v := newValues()

	// Flags are parsed first but applied last: the config file they may
	// name sits below the environment in precedence.
	flags := make(map[string]string)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	for _, s := range v.settings {
		fs.Var(&flagValue{env: s.Env, got: flags, isBool: s.Kind == KindBool}, s.Flag, s.Help)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if usage != nil {
				Usage(usage)
			}
			return nil, flag.ErrHelp
		}
		return nil, fmt.Errorf("%w (see edgerelay serve --help)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: edgerelay serve takes only flags (see edgerelay serve --help)", fs.Arg(0))
	}

	env := make(map[string]string)
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "RELAY_") {
			continue
		}
		env[name] = val
		if _, known := v.index[name]; !known {
			v.unknownEnv = append(v.unknownEnv, name)
		}
	}
	sort.Strings(v.unknownEnv)
	v.unknownEnv = dedupSorted(v.unknownEnv)

	path, ok := flags[EnvConfig]
	if !ok {
		path = env[EnvConfig]
	}
	if path != "" {
		if err := v.readFile(path); err != nil {
			return nil, err
		}
	}

	// Table order, not map order, so that of two bad values the same one
	// is always reported.
	for i, s := range v.settings {
		if raw, ok := env[s.Env]; ok {
			if err := v.set(i, raw, SourceEnv, "from the environment"); err != nil {
				return nil, err
			}
		}
	}
	for i, s := range v.settings {
		if raw, ok := flags[s.Env]; ok {
			if err := v.set(i, raw, SourceFlag, "from flag --"+s.Flag); err != nil {
				return nil, err
			}
		}
	}
	return v, nil
}

func newValues() *Values {
	all := All()
	v := &Values{
		settings: all,
		index:    make(map[string]int, len(all)),
		vals:     make([]value, len(all)),
	}
	for i, s := range all {
		v.index[s.Env] = i
		v.vals[i] = value{raw: s.Default, src: SourceDefault}
	}
	return v
}

// set checks raw against setting i's kind and stores it. where completes
// the error message ("from the environment"); secrets are never quoted.
func (v *Values) set(i int, raw string, src Source, where string) error {
	s := &v.settings[i]
	if err := checkKind(s.Kind, raw); err != nil {
		shown := strconv.Quote(raw)
		if s.Secret {
			shown = "(secret value)"
		}
		if where != "" {
			where = " " + where
		}
		return fmt.Errorf("invalid %s %s%s: %v", s.Env, shown, where, err)
	}
	v.vals[i] = value{raw: raw, src: src}
	return nil
}

// readFile applies a config file. Its format is deliberately the simplest
// that an env file, a systemd EnvironmentFile and a hand-written file share:
//
//	# comment (only at the start of a line: values may contain '#')
//	RELAY_MAILBOX_LISTEN=0.0.0.0:8080
//	turn-listen =            (the flag name works too; empty turns TURN off)
//	RELAY_APPS="notes;chat:push=com.example.chat"
//
// Space around the name and the value is trimmed and one pair of matching
// surrounding quotes (" or ') is removed; nothing else is interpreted. An
// unknown name, a line without '=' or a name given twice is an error that
// names the file and the line: a silently ignored typo in a config file is
// an afternoon lost.
func (v *Values) readFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	byFlag := make(map[string]int, len(v.settings))
	for i, s := range v.settings {
		byFlag[s.Flag] = i
	}
	seen := make(map[int]int) // setting → line that set it
	for n, line := range strings.Split(string(data), "\n") {
		n++ // line numbers start at 1
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		name, raw, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("%s:%d: want RELAY_NAME=value, got %q", path, n, line)
		}
		name = strings.TrimSpace(name)
		raw = unquote(strings.TrimSpace(raw))
		i, known := v.index[name]
		if !known {
			i, known = byFlag[name]
		}
		if !known {
			return fmt.Errorf("%s:%d: unknown setting %q (see edgerelay serve --help)", path, n, name)
		}
		if v.settings[i].Env == EnvConfig {
			return fmt.Errorf("%s:%d: a config file cannot name another config file", path, n)
		}
		if prev, dup := seen[i]; dup {
			return fmt.Errorf("%s:%d: %s already set on line %d", path, n, v.settings[i].Env, prev)
		}
		seen[i] = n
		if err := v.set(i, raw, SourceFile, ""); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	v.file = path
	return nil
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

func dedupSorted(s []string) []string {
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

// flagValue records a flag's raw text for Load to check and apply after
// the config file and the environment.
type flagValue struct {
	env    string
	got    map[string]string
	isBool bool
}

func (f *flagValue) String() string { return "" }

func (f *flagValue) Set(s string) error {
	f.got[f.env] = s
	return nil
}

// IsBoolFlag lets "--push-registration" stand for "--push-registration=true".
func (f *flagValue) IsBoolFlag() bool { return f.isBool }

// checkKind says why raw is not a value of kind k, or returns nil.
func checkKind(k Kind, raw string) error {
	switch k {
	case KindString:
		return nil
	case KindInt:
		n, err := strconv.Atoi(raw)
		if err != nil || n <= 0 {
			return errors.New("want a positive integer")
		}
	case KindOptionalInt:
		if raw == "" {
			return nil
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 {
			return errors.New("want an integer >= 0, or empty for unset")
		}
	case KindBool:
		if _, err := strconv.ParseBool(raw); err != nil {
			return errors.New("want true or false")
		}
	case KindDuration:
		d, err := time.ParseDuration(raw)
		if err != nil {
			return errors.New("want a duration such as 10s, 5m or 720h")
		}
		if d <= 0 {
			return errors.New("want a positive duration")
		}
	case KindAddr:
		if raw == "" {
			return nil
		}
		_, port, err := net.SplitHostPort(raw)
		if err != nil {
			return errors.New("want host:port (such as 127.0.0.1:8080 or :8080), or empty to turn the service off")
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return errors.New("want a port number from 0 to 65535")
		}
	case KindIP:
		if raw == "" {
			return nil
		}
		if _, err := netip.ParseAddr(raw); err != nil {
			return errors.New("want an IP address")
		}
	case KindCIDRs:
		_, err := parseCIDRs(raw)
		return err
	case KindURL:
		if raw == "" {
			return nil
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return errors.New("want an absolute http or https URL")
		}
	case KindLevel:
		var l slog.Level
		if err := l.UnmarshalText([]byte(raw)); err != nil {
			return errors.New("want debug, info, warn or error")
		}
	default:
		return fmt.Errorf("unknown kind %v", k)
	}
	return nil
}

// parseCIDRs parses a comma-separated list of prefixes; a bare address is
// the prefix of that address alone.
func parseCIDRs(raw string) ([]netip.Prefix, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if p, err := netip.ParsePrefix(part); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR prefix (such as 10.0.0.0/8) or an IP address", part)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

func (v *Values) lookup(env string, kinds ...Kind) value {
	i, ok := v.index[env]
	if !ok {
		panic("config: no setting named " + env)
	}
	if len(kinds) > 0 {
		match := false
		for _, k := range kinds {
			match = match || v.settings[i].Kind == k
		}
		if !match {
			panic(fmt.Sprintf("config: %s is a %v setting", env, v.settings[i].Kind))
		}
	}
	return v.vals[i]
}

// String returns the setting's value as given, for any kind; "" for an
// empty or unset value. For a secret it is the secret itself: prefer
// [Config], whose [Secret] fields cannot be printed by accident.
func (v *Values) String(env string) string { return v.lookup(env).raw }

// Int returns the value of a KindInt setting.
func (v *Values) Int(env string) int {
	n, _ := strconv.Atoi(v.lookup(env, KindInt).raw)
	return n
}

// OptionalInt returns the value of a KindOptionalInt setting and whether it
// has one: set to "" (or never set, when the default is "") gives ok false.
func (v *Values) OptionalInt(env string) (n int, ok bool) {
	raw := v.lookup(env, KindOptionalInt).raw
	if raw == "" {
		return 0, false
	}
	n, _ = strconv.Atoi(raw)
	return n, true
}

// Bool returns the value of a KindBool setting.
func (v *Values) Bool(env string) bool {
	b, _ := strconv.ParseBool(v.lookup(env, KindBool).raw)
	return b
}

// Duration returns the value of a KindDuration setting.
func (v *Values) Duration(env string) time.Duration {
	d, _ := time.ParseDuration(v.lookup(env, KindDuration).raw)
	return d
}

// IsSet reports whether any layer gave the setting a value, empty included.
// This is how RELAY_TURN_LISTEN= (TURN off) differs from no RELAY_TURN_LISTEN
// at all (TURN on its default address).
func (v *Values) IsSet(env string) bool { return v.lookup(env).src != SourceDefault }

// Source returns the layer that gave the setting its value.
func (v *Values) Source(env string) Source { return v.lookup(env).src }

// File returns the config file that was read, or "" if none was.
func (v *Values) File() string { return v.file }

// UnknownEnv returns, sorted, the RELAY_* environment variables that name no
// setting. They are not an error (other tools may share the prefix), but a
// misspelt setting is otherwise silently ignored, so the server should log
// them as a warning.
func (v *Values) UnknownEnv() []string { return append([]string(nil), v.unknownEnv...) }

// LogValue lists the settings that some layer set (defaults are in --help),
// keyed by environment name; secrets appear as "[redacted]".
func (v *Values) LogValue() slog.Value {
	var attrs []slog.Attr
	if v.file != "" {
		attrs = append(attrs, slog.String("config_file", v.file))
	}
	for i, s := range v.settings {
		if v.vals[i].src == SourceDefault || s.Env == EnvConfig {
			continue
		}
		val := v.vals[i].raw
		if s.Secret {
			val = redacted
		}
		attrs = append(attrs, slog.String(s.Env, val))
	}
	return slog.GroupValue(attrs...)
}
