// Command edgerelay is the relay: `serve` (the default) runs every
// configured service; `keys` manages claim keys and other secrets; `backup`
// and `restore` copy the store; `conformance` checks any relay from the
// outside; `version` prints the build.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
)

const usageText = `usage: edgerelay [command] [flags]

commands:
  serve         run the relay (the default); edgerelay serve --help lists every setting
  keys          manage keys: edgerelay keys channel add --host NAME | list | revoke --host NAME
  backup        copy the store, while the server runs or not: edgerelay backup DIR (new or empty)
  restore       put a backup into a data dir without a store: edgerelay restore DIR
  cluster       cluster mode: edgerelay cluster forget-setting NAME
  conformance   check a relay from the outside: edgerelay conformance channel --origin URL --key-a-file F --key-b-file F
  version       print the version

Flags may stand before or after a command's arguments; -- ends them.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" {
		return runServe(args, stdout, stderr)
	}
	switch args[0] {
	case "serve":
		return runServe(args[1:], stdout, stderr)
	case "keys":
		return runKeys(args[1:], stdout, stderr)
	case "backup":
		return runBackup(args[1:], stdout, stderr)
	case "restore":
		return runRestore(args[1:], stdout, stderr)
	case "conformance":
		return runConformance(args[1:], stdout, stderr)
	case "cluster":
		return runCluster(args[1:], stdout, stderr)
	case "version":
		// No flags, but the same rule as every command: --help is help, and
		// anything else is refused rather than ignored.
		fs := flag.NewFlagSet("version", flag.ContinueOnError)
		if code, ok := parseFlags(fs, args[1:], usageText, stdout, stderr); !ok {
			return code
		}
		if fs.NArg() > 0 {
			return usageError(stderr, "version", fmt.Sprintf("unexpected argument %q", fs.Arg(0)), usageText)
		}
		fmt.Fprintln(stdout, version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "edgerelay: unknown command %q\n\n%s", args[0], usageText)
		return 2
	}
}

// version is the module version and VCS revision the binary was built from.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "edgerelay (unknown build)"
	}
	v := "edgerelay " + info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
	}
	return v + " " + info.GoVersion
}
