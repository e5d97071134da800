package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"edgerelay/fastpath/admin/cliflag"
)

// parseFlags parses the arguments of a subcommand with the command line's
// one flag rule (cliflag.Parse: flags before, between or after the
// positional arguments; "--" ends them). ok is false when the command must
// stop and exit with code: 0 after -h or --help, which print usage on
// stdout; 2 after a bad flag, which prints the error and usage on stderr.
// fs.Name() is the subcommand as the operator typed it ("keys agent
// pair-key"), so that the error says which command refused the flag.
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) (code int, ok bool) {
	// The flag package's own printing would add its default usage after
	// ours; every message is printed here instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := cliflag.Parse(fs, args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return 0, false
	default:
		return usageError(stderr, fs.Name(), err.Error(), usage), false
	}
}

// helpAsked reports whether args start with -h, -help or --help, which
// the flag package reads as a request for help: for a command group
// (`keys --help`, `keys agent -h`), whose flags are parsed only below it.
func helpAsked(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help")
}

// usageError prints "edgerelay <command>: <msg>" and the command's usage on
// stderr, and returns the exit code of a usage error.
func usageError(stderr io.Writer, command, msg, usage string) int {
	fmt.Fprintf(stderr, "edgerelay %s: %s\n\n%s", command, msg, usage)
	return 2
}
