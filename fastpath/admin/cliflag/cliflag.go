// Package cliflag is the one flag rule of edgerelay's command line: flags
// may stand before, between and after the positional arguments
// (`keys agent pair-key ACCOUNT --ttl 1m` as well as `--ttl 1m ACCOUNT`).
// Go's flag package stops at the first positional argument, so without
// this a flag written after one is taken for another positional argument
// and the command fails with a usage error.
//
// It lives here, below cmd, because the push key commands
// (fastpath/pushgw/keycmd) parse their own flags too.
package cliflag

import (
	"flag"
	"strings"
)

// Parse parses the flags in args with fs wherever they stand among the
// positional arguments. Afterwards fs.Args, fs.NArg and fs.Arg give the
// positional arguments in their order, as after [flag.FlagSet.Parse].
//
// The syntax is the flag package's: -name, --name, -name=value,
// --name=value, and "-name value" for a flag that is not boolean (its
// next argument is its value, whatever it looks like). "--" ends the
// flags: every argument after it is positional, even one that starts with
// "-". A lone "-" is positional. Errors are the flag package's (an
// unknown flag, a missing or bad value, [flag.ErrHelp] for -h and --help
// when fs defines neither), returned at the first bad flag.
func Parse(fs *flag.FlagSet, args []string) error {
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		// One flag at a time, with its value when that is the next
		// argument, so that the flag package checks syntax and value and
		// never sees a positional argument.
		n := 1
		if takesNextArg(fs, a) && i+1 < len(args) {
			n = 2
		}
		if err := fs.Parse(args[i : i+n]); err != nil {
			return err
		}
		i += n - 1
	}
	// Hand the positional arguments to fs, behind a "--" so that none of
	// them is read as a flag.
	return fs.Parse(append([]string{"--"}, positional...))
}

// takesNextArg says whether the flag written as arg takes the argument
// after it as its value: a defined flag that is not boolean, written
// without "=value". An undefined flag takes none; fs.Parse reports it.
func takesNextArg(fs *flag.FlagSet, arg string) bool {
	name := strings.TrimPrefix(arg[1:], "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}
