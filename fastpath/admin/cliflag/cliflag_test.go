package cliflag_test

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/admin/cliflag"
)

type parsed struct {
	ttl        time.Duration
	label      string
	verbose    bool
	positional []string
}

func parse(args ...string) (parsed, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ttl := fs.Duration("ttl", 15*time.Minute, "")
	label := fs.String("label", "", "")
	verbose := fs.Bool("verbose", false, "")
	err := cliflag.Parse(fs, args)
	return parsed{*ttl, *label, *verbose, fs.Args()}, err
}

func TestParseFlagsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want parsed
	}{
		{nil, parsed{15 * time.Minute, "", false, []string{}}},
		{[]string{"acct"}, parsed{15 * time.Minute, "", false, []string{"acct"}}},
		// The form and its mirror.
		{[]string{"acct", "--ttl", "1m"}, parsed{time.Minute, "", false, []string{"acct"}}},
		{[]string{"--ttl", "1m", "acct"}, parsed{time.Minute, "", false, []string{"acct"}}},
		{[]string{"-ttl=2m", "acct"}, parsed{2 * time.Minute, "", false, []string{"acct"}}},
		{[]string{"a", "--verbose", "b", "--label=x", "c"}, parsed{15 * time.Minute, "x", true, []string{"a", "b", "c"}}},
		// A boolean flag never takes the next argument.
		{[]string{"--verbose", "a"}, parsed{15 * time.Minute, "", true, []string{"a"}}},
		{[]string{"--verbose=false", "a"}, parsed{15 * time.Minute, "", false, []string{"a"}}},
		// A value flag takes the next argument whatever it looks like.
		{[]string{"--label", "--", "a"}, parsed{15 * time.Minute, "--", false, []string{"a"}}},
		{[]string{"--label", "-x", "a"}, parsed{15 * time.Minute, "-x", false, []string{"a"}}},
		// "--" ends the flags; a lone "-" is positional.
		{[]string{"a", "--", "--ttl", "1m", "-"}, parsed{15 * time.Minute, "", false, []string{"a", "--ttl", "1m", "-"}}},
		{[]string{"--", "--"}, parsed{15 * time.Minute, "", false, []string{"--"}}},
		{[]string{"-", "--ttl", "1m"}, parsed{time.Minute, "", false, []string{"-"}}},
		// The last value of a flag given twice wins, as with flag.Parse.
		{[]string{"--ttl", "1m", "a", "--ttl", "3m"}, parsed{3 * time.Minute, "", false, []string{"a"}}},
	} {
		got, err := parse(tc.args...)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if len(got.positional) == 0 && len(tc.want.positional) == 0 {
			got.positional, tc.want.positional = nil, nil
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"a", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"--bogus", "a"}, "flag provided but not defined: -bogus"},
		{[]string{"a", "--ttl"}, "flag needs an argument: -ttl"},
		{[]string{"a", "--ttl", "soon"}, `invalid value "soon" for flag -ttl`},
		{[]string{"a", "---ttl", "1m"}, "bad flag syntax: ---ttl"},
		{[]string{"a", "--=1m"}, "bad flag syntax: --=1m"},
		{[]string{"a", "--verbose=maybe"}, `invalid boolean value "maybe" for -verbose`},
	} {
		_, err := parse(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, help := range []string{"-h", "--help", "-help"} {
		if _, err := parse("a", help); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s after a positional: %v, want flag.ErrHelp", help, err)
		}
	}
	// After "--" nothing is a flag, not even a bad one.
	if got, err := parse("--", "--bogus"); err != nil || !reflect.DeepEqual(got.positional, []string{"--bogus"}) {
		t.Errorf(`"--" then --bogus: %v %q`, err, got.positional)
	}
}
