// Package fuzz holds the tests of `make fuzz`'s runner (run.sh and the
// verdict in classify.sh); the fuzz targets are its subpackages.
package fuzz

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// canned reads an output of go test -fuzz kept in testdata/runner:
// crash.out, seed.out and build.out are real (Go 1.26.8, a target that
// panics, the same with its crasher in the seed corpus, a build error);
// deadline.out is the flake of golang/go#75804 as make fuzz printed it;
// pass.out a run that found nothing.
func canned(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "runner", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
}

func bash(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash:", err)
	}
	return path
}

func TestClassify(t *testing.T) {
	classify, err := filepath.Abs("classify.sh")
	if err != nil {
		t.Fatal(err)
	}
	const crasher = "1a4feb8ad1fe53b6" // the name crash.out prints
	deadline := canned(t, "deadline.out")
	for _, tc := range []struct {
		name          string
		out           string
		rc            int
		target        string
		before, after []string // the target's testdata/fuzz dir; nil after: no dir
		want          string
	}{
		{"a crasher written and named", canned(t, "crash.out"), 1, "FuzzCrash",
			[]string{"seed1"}, []string{"seed1", crasher}, "fail pkg/testdata/fuzz/FuzzCrash/" + crasher},
		{"a crasher named only by the output", canned(t, "crash.out"), 1, "FuzzCrash",
			[]string{crasher}, []string{crasher}, "fail pkg/testdata/fuzz/FuzzCrash/" + crasher},
		{"a reproducer beside a deadline error", deadline, 1, "FuzzAppendData",
			[]string{"seed1"}, []string{"0badf00d", "seed1"}, "fail pkg/testdata/fuzz/FuzzAppendData/0badf00d"},
		{"two reproducers", "", 1, "FuzzAppendData",
			nil, []string{"0badf00d", "1badf00d"}, "fail pkg/testdata/fuzz/FuzzAppendData/0badf00d pkg/testdata/fuzz/FuzzAppendData/1badf00d"},
		{"deadline only", deadline, 1, "FuzzAppendData",
			[]string{"seed1", "seed2"}, []string{"seed1", "seed2"}, "flake"},
		{"deadline only, no corpus dir", deadline, 1, "FuzzAppendData", nil, nil, "flake"},
		{"deadline only, CRLF and trailing blanks", strings.ReplaceAll(deadline, "\n", " \r\n"), 1, "FuzzAppendData", nil, nil, "flake"},
		{"deadline and a failing check", strings.Replace(deadline, "    context", "        fuzz_test.go:40: mismatch\n    context", 1), 1, "FuzzAppendData",
			nil, nil, "fail"},
		{"deadline of another target", deadline, 1, "FuzzParse", nil, nil, "fail"},
		{"deadline line missing", strings.Replace(deadline, "    context deadline exceeded\n", "", 1), 1, "FuzzAppendData", nil, nil, "fail"},
		{"a seed corpus entry fails", canned(t, "seed.out"), 1, "FuzzCrash",
			[]string{crasher}, []string{crasher}, "fail"},
		{"build error", canned(t, "build.out"), 1, "FuzzCrash", nil, nil, "fail"},
		{"exit 1 and no output", "", 1, "FuzzCrash", nil, nil, "fail"},
		{"killed", "fuzz: elapsed: 3s, execs: 1 (0/sec)\n", 137, "FuzzCrash", nil, nil, "fail"},
		{"pass", canned(t, "pass.out"), 0, "FuzzPass", []string{"seed1"}, []string{"seed1"}, "pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, name := range tc.after {
				writeFile(t, filepath.Join(dir, "pkg", "testdata", "fuzz", tc.target, name), "go test fuzz v1\n")
			}
			writeFile(t, filepath.Join(dir, "before"), strings.Join(append(tc.before, ""), "\n"))
			writeFile(t, filepath.Join(dir, "log"), tc.out)
			cmd := exec.Command(bash(t), "-c", `set -euo pipefail; . "$0"; fuzz_classify "$@"`, classify,
				strconv.Itoa(tc.rc), "log", "before", "pkg", tc.target)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Errorf("verdict %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRunSh runs make fuzz's script on a module of three targets with a
// stand-in go command (testdata/runner/fakego.sh): one passes, one exits
// with golang/go#75804's bare deadline, one writes a crasher. It checks the
// verdicts, the exit status, the summary line, which Go fuzzed, and that the
// inputs Go kept in its cache still land in the corpus without counting as
// findings.
func TestRunSh(t *testing.T) {
	const crasher = "1a4feb8ad1fe53b6"
	const fixed = "which has the fix of golang/go#75804"
	const unfixed = "without the fix of golang/go#75804: a bare deadline exit is a flake"
	for _, tc := range []struct {
		name           string
		installed      string
		fetchable      string
		fuzzToolchain  string // FUZZ_GOTOOLCHAIN, unset when empty
		crash          bool
		brokenPkg      bool   // a second package whose go test -list fails
		wantToolchain  string // GOTOOLCHAIN of every go test -fuzz (local: the installed Go)
		wantCode       int
		wantSummary    string
		wantStderrPart string
	}{
		{"crasher, flake, pass", "go1.26.8", "go1.27.3", "", true, false, "local", 1,
			"fuzz: 1 passed, 1 failed, 1 flaked (failed: pkga FuzzCrash (pkga/testdata/fuzz/FuzzCrash/" + crasher + ")) (flaked, skipped: pkga FuzzAppendData); fuzzed with go1.26.8, " + unfixed, ""},
		{"flake and pass: exit 0", "go1.26.8", "go1.27.3", "", false, false, "local", 0,
			"fuzz: 1 passed, 0 failed, 1 flaked (flaked, skipped: pkga FuzzAppendData); fuzzed with go1.26.8, " + unfixed, ""},
		{"a package that does not build", "go1.26.8", "go1.27.3", "", false, true, "local", 1,
			"fuzz: 1 passed, 1 failed, 1 flaked (failed: pkgb (go test -list failed)) (flaked, skipped: pkga FuzzAppendData); fuzzed with go1.26.8, " + unfixed, ""},
		{"FUZZ_GOTOOLCHAIN=go1.27.3", "go1.26.8", "go1.27.3", "go1.27.3", true, false, "go1.27.3", 1,
			"fuzz: 1 passed, 1 failed, 1 flaked (failed: pkga FuzzCrash (pkga/testdata/fuzz/FuzzCrash/" + crasher + ")) (flaked, skipped: pkga FuzzAppendData); fuzzed with go1.27.3, " + fixed, ""},
		{"FUZZ_GOTOOLCHAIN=go1.27.3 not to be had", "go1.26.8", "", "go1.27.3", false, false, "local", 0,
			"fuzz: 1 passed, 0 failed, 1 flaked (flaked, skipped: pkga FuzzAppendData); fuzzed with go1.26.8, " + unfixed,
			"fuzz: Go go1.27.3 cannot be had here; fuzzing with the installed go1.26.8 (go: download go1.27.3 for linux/amd64: toolchain not available)"},
		{"installed Go has the fix", "go1.27.1", "", "", false, false, "local", 0,
			"fuzz: 1 passed, 0 failed, 1 flaked (flaked, skipped: pkga FuzzAppendData); fuzzed with go1.27.1, " + fixed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, fake := t.TempDir(), t.TempDir()
			for _, name := range []string{"run.sh", "classify.sh"} {
				writeFile(t, filepath.Join(root, "fuzz", name), readFile(t, name))
			}
			writeFile(t, filepath.Join(fake, "bin", "go"), canned(t, "fakego.sh"))
			writeFile(t, filepath.Join(fake, "installed"), tc.installed+"\n")
			writeFile(t, filepath.Join(fake, "fetchable"), tc.fetchable+"\n")
			packages := "fake/pkga pkga\n"
			if tc.brokenPkg {
				packages += "fake/pkgb pkgb\n" // and no targets file: the stand-in's go test -list fails
			}
			writeFile(t, filepath.Join(fake, "packages"), packages)
			targets := "FuzzPass\nFuzzAppendData\n"
			if tc.crash {
				targets += "FuzzCrash\n"
			}
			writeFile(t, filepath.Join(fake, "targets", "pkga"), targets+"ok  \tfake/pkga\t0.011s\n")
			writeFile(t, filepath.Join(fake, "runs", "FuzzPass", "out"), canned(t, "pass.out"))
			writeFile(t, filepath.Join(fake, "runs", "FuzzPass", "learn"), "aaaa\nbbbb\n")
			writeFile(t, filepath.Join(fake, "runs", "FuzzAppendData", "out"), canned(t, "deadline.out"))
			writeFile(t, filepath.Join(fake, "runs", "FuzzAppendData", "rc"), "1\n")
			writeFile(t, filepath.Join(fake, "runs", "FuzzAppendData", "learn"), "cccc\nseed1\n")
			writeFile(t, filepath.Join(fake, "runs", "FuzzCrash", "out"), canned(t, "crash.out"))
			writeFile(t, filepath.Join(fake, "runs", "FuzzCrash", "rc"), "1\n")
			writeFile(t, filepath.Join(fake, "runs", "FuzzCrash", "write"), crasher+"\n")
			writeFile(t, filepath.Join(root, "pkga", "testdata", "fuzz", "FuzzAppendData", "seed1"), "go test fuzz v1\n")

			cmd := exec.Command(bash(t), filepath.Join(root, "fuzz", "run.sh"), "1s")
			cmd.Dir = t.TempDir() // run.sh finds the module from its own path
			cmd.Env = []string{"PATH=" + filepath.Join(fake, "bin") + ":" + os.Getenv("PATH"), "FAKEGO=" + fake, "HOME=" + fake}
			if tc.fuzzToolchain != "" {
				cmd.Env = append(cmd.Env, "FUZZ_GOTOOLCHAIN="+tc.fuzzToolchain)
			}
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := cmd.ProcessState.ExitCode()
			if err != nil && code < 0 {
				t.Fatal(err)
			}
			if strings.Contains(stderr.String(), "fakego: unexpected call") {
				t.Fatalf("run.sh made a call the stand-in does not know:\n%s", stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if code != tc.wantCode || lines[len(lines)-1] != tc.wantSummary {
				t.Fatalf("exit %d (want %d), last line:\n%s\nwant:\n%s\nstdout:\n%s\nstderr:\n%s",
					code, tc.wantCode, lines[len(lines)-1], tc.wantSummary, stdout.String(), stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderrPart) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantStderrPart, stderr.String())
			}
			for _, want := range []string{
				`   flake: exit 1 with only "context deadline exceeded" and no reproducer (golang/go#75804); going on`,
				"   corpus: 2 new inputs kept in pkga/testdata/fuzz/FuzzPass",
				"   corpus: 1 new inputs kept in pkga/testdata/fuzz/FuzzAppendData",
			} {
				if !slices.Contains(lines, want) {
					t.Errorf("stdout lacks the line %q:\n%s", want, stdout.String())
				}
			}
			if tc.crash && !slices.Contains(lines, "   FAIL: reproducer pkga/testdata/fuzz/FuzzCrash/"+crasher) {
				t.Errorf("stdout does not name the reproducer:\n%s", stdout.String())
			}
			for target, want := range map[string][]string{
				"FuzzPass": {"aaaa", "bbbb"}, "FuzzAppendData": {"cccc", "seed1"},
			} {
				entries, err := os.ReadDir(filepath.Join(root, "pkga", "testdata", "fuzz", target))
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, e := range entries {
					got = append(got, e.Name())
				}
				if !slices.Equal(got, want) {
					t.Errorf("corpus of %s: %q, want %q", target, got, want)
				}
			}
			calls := strings.Fields(readFile(t, filepath.Join(fake, "calls")))
			wantCalls := []string{"FuzzPass", "GOTOOLCHAIN=" + tc.wantToolchain, "FuzzAppendData", "GOTOOLCHAIN=" + tc.wantToolchain}
			if tc.crash {
				wantCalls = append(wantCalls, "FuzzCrash", "GOTOOLCHAIN="+tc.wantToolchain)
			}
			if !slices.Equal(calls, wantCalls) {
				t.Errorf("go test -fuzz calls %q, want %q", calls, wantCalls)
			}
		})
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
