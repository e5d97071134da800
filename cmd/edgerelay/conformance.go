package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"edgerelay/sdk/channelcheck"
)

const conformanceUsage = `usage: edgerelay conformance channel --origin URL --key-a-file F --key-b-file F [flags]

Checks a private channel relay (ours or any other) from the outside and ends
with "conformance: pass" (exit 0) or the failed checks and "conformance: fail"
(exit 1). It uses up both claim keys: give it two keys nobody has claimed.

  --origin URL        the relay, http(s)://host:port
  --key-a-file FILE   file holding claim key A
  --key-b-file FILE   file holding claim key B
  --ca FILE           PEM CA certificate(s) to trust besides the system's
  --restart-cmd CMD   run "sh -c CMD" to restart the relay, then check that
                      both keys stay used
  --timeout D         bound of each check, the restart command included (default 10s)
  --verbose           progress on stderr
`

// runConformance implements `edgerelay conformance channel --origin URL --key-a-file F --key-b-file F [--ca FILE] [--restart-cmd CMD] [--timeout D]`.
func runConformance(args []string, stdout, stderr io.Writer) int {
	if helpAsked(args) {
		fmt.Fprint(stdout, conformanceUsage)
		return 0
	}
	if len(args) == 0 || args[0] != "channel" {
		fmt.Fprint(stderr, conformanceUsage)
		return 2
	}
	fs := flag.NewFlagSet("conformance channel", flag.ContinueOnError)
	origin := fs.String("origin", "", "relay origin")
	keyAFile := fs.String("key-a-file", "", "claim key A file")
	keyBFile := fs.String("key-b-file", "", "claim key B file")
	caFile := fs.String("ca", "", "PEM CA file")
	restartCmd := fs.String("restart-cmd", "", "restart command")
	timeout := fs.Duration("timeout", channelcheck.DefaultTimeout, "bound of each check")
	verbose := fs.Bool("verbose", false, "progress on stderr")
	if code, ok := parseFlags(fs, args[1:], conformanceUsage, stdout, stderr); !ok {
		return code
	}
	badUsage := func(msg string) int { return usageError(stderr, fs.Name(), msg, conformanceUsage) }
	switch {
	case fs.NArg() > 0:
		return badUsage(fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	case *origin == "" || *keyAFile == "" || *keyBFile == "":
		return badUsage("--origin, --key-a-file and --key-b-file are required")
	case *timeout <= 0:
		return badUsage("--timeout must be positive")
	}

	opts := channelcheck.Options{Origin: *origin, Timeout: *timeout}
	var err error
	if opts.KeyA, err = conformanceReadKey(*keyAFile); err != nil {
		return badUsage(err.Error())
	}
	if opts.KeyB, err = conformanceReadKey(*keyBFile); err != nil {
		return badUsage(err.Error())
	}
	if opts.TLSConfig, err = conformanceTLS(*caFile); err != nil {
		return badUsage(err.Error())
	}
	if *restartCmd != "" {
		opts.Restart = conformanceRestartHook(*restartCmd, stderr)
	}
	if *verbose {
		opts.Log = stderr
	}

	// An interrupted run still closes its sockets and reports what it did.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep := channelcheck.Run(ctx, opts)

	for _, c := range rep.Checks {
		if c.Err == nil {
			fmt.Fprintf(stdout, "ok   %s\n", c.Name)
		} else {
			// One line per check, even for joined errors.
			fmt.Fprintf(stdout, "FAIL %s: %s\n", c.Name, strings.ReplaceAll(c.Err.Error(), "\n", "; "))
		}
	}
	if rep.Passed() {
		fmt.Fprintln(stdout, "conformance: pass")
		return 0
	}
	fmt.Fprintln(stdout, "failed checks:")
	for _, c := range rep.Failed() {
		fmt.Fprintf(stdout, "  %s\n", c.Name)
	}
	fmt.Fprintln(stdout, "conformance: fail")
	return 1
}

// conformanceReadKey reads a file holding one claim key, as the operator
// saved it (a trailing newline is fine).
func conformanceReadKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read claim key: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" || strings.ContainsAny(key, " \t\r\n") {
		return "", fmt.Errorf("%s: want exactly one claim key", path)
	}
	return key, nil
}

// conformanceTLS trusts the CA certificates in caFile on top of the
// system's roots, for a relay whose certificate a private CA signed. No
// file means Go's defaults.
func conformanceTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // no system roots here: the CA alone
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate found", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// conformanceRestartHook runs cmdline with sh, its output on out (stdout
// stays the report). The checker's per-check bound ends a hung command;
// WaitDelay keeps a child that inherited the pipes from holding us after.
func conformanceRestartHook(cmdline string, out io.Writer) func(context.Context) error {
	return func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, "sh", "-c", cmdline)
		cmd.Stdout, cmd.Stderr = out, out
		cmd.WaitDelay = 5 * time.Second
		err := cmd.Run()
		if errors.Is(err, exec.ErrWaitDelay) {
			// The command succeeded; a relay it started in the background
			// merely kept our output pipe open.
			return nil
		}
		if err != nil {
			return fmt.Errorf("sh -c %q: %w", cmdline, err)
		}
		return nil
	}
}
