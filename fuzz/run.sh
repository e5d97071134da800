#!/usr/bin/env bash
# make fuzz: run every fuzz target in the module for FUZZTIME each (default
# 30s): bash fuzz/run.sh [FUZZTIME [PACKAGES...]] (default ./...).
#
# Go runs one fuzz target per invocation, so targets are listed per package
# and run one after another. Each run gets a verdict (fuzz/classify.sh):
# pass; fail, with the reproducers Go wrote under the package's
# testdata/fuzz/<Target>/ (keep them as regressions); or flake, a bare
# "context deadline exceeded" at the end of -fuzztime with nothing written
# (golang/go#75804), reported and skipped. The last line sums them up and
# names the Go that fuzzed; the exit status is 1 only when a target failed.
#
# The fix of golang/go#75804 shipped in Go 1.27, which the go command can
# fetch from the module proxy (FUZZ_GOTOOLCHAIN=go1.27.3: only the fuzzing
# runs on it, listing the targets stays on the installed Go). It is not the
# default: the targets check our code against the standard library of the
# Go that runs them, and Go 1.27's encoding/json writes invalid UTF-8 as a
# raw U+FFFD where Go 1.26, which the relay is built with, writes \ufffd,
# so FuzzAppend (fastpath/jsonstr) fails its seed corpus on 1.27.3. On the
# installed Go the deadline flake is told apart instead, as above. A
# toolchain that cannot be fetched falls back to the installed Go, saying so.
#
# Go keeps the other inputs that found new coverage in its build cache; they
# are copied into testdata/fuzz/<Target>/ too (names are content hashes, so
# a copy is never duplicated), so that the corpus lives in the repository:
# commit them, and every `go test` replays them.
set -euo pipefail
cd "$(dirname "$0")/.."
. fuzz/classify.sh
fuzztime="${1:-${FUZZTIME:-30s}}"
shift || true
packages=("${@:-./...}")

installed=$(GOTOOLCHAIN=local go env GOVERSION)
toolchain="${FUZZ_GOTOOLCHAIN:-local}"
if [ "$toolchain" != local ] && ! why=$(GOTOOLCHAIN="$toolchain" go version 2>&1 >/dev/null); then
  echo "fuzz: Go $toolchain cannot be had here; fuzzing with the installed $installed ($why)" >&2
  toolchain=local
fi
gover=$(GOTOOLCHAIN="$toolchain" go env GOVERSION)
if printf '%s\n' go1.27 "$gover" | sort -V -C; then
  fuzzedwith="fuzzed with $gover, which has the fix of golang/go#75804"
else
  fuzzedwith="fuzzed with $gover, without the fix of golang/go#75804: a bare deadline exit is a flake"
fi
echo "fuzz: $fuzzedwith"

cache="$(go env GOCACHE)/fuzz"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=()
flaked=()
for pkg in $(go list "${packages[@]}"); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  rel=${dir#$PWD/}
  if [ "$dir" = "$PWD" ]; then
    rel=.
  fi
  # A package that does not build has targets nobody fuzzed: a failure,
  # not a silent skip.
  if ! list=$(go test -list '^Fuzz' "$pkg" 2>&1); then
    echo "$list"
    echo "   FAIL: go test -list failed for $pkg: its fuzz targets did not run"
    failed+=("$rel (go test -list failed)")
    continue
  fi
  for target in $(grep '^Fuzz' <<<"$list" || true); do
    echo "== $pkg $target ($fuzztime)"
    corpus="$rel/testdata/fuzz/$target"
    fuzz_list "$corpus" >"$work/before"
    # Go minimizes every new interesting input for up to a minute by
    # default, with no execs counted meanwhile: with 20-30s per target
    # that stalled whole runs (FuzzAppendData: 219k execs in 15s, 640k
    # with 1s of minimizing). Crashers are kept whether minimized or not.
    rc=0
    GOTOOLCHAIN="$toolchain" go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 2s "$pkg" 2>&1 |
      tee "$work/log" || rc=${PIPESTATUS[0]}
    verdict=$(fuzz_classify "$rc" "$work/log" "$work/before" "$rel" "$target")
    case $verdict in
      pass) passed=$((passed + 1)) ;;
      flake)
        echo "   flake: exit $rc with only \"context deadline exceeded\" and no reproducer (golang/go#75804); going on"
        flaked+=("$rel $target")
        ;;
      fail)
        echo "   FAIL: exit $rc, no reproducer written; the output above says why"
        failed+=("$rel $target (no reproducer)")
        ;;
      fail\ *)
        echo "   FAIL: reproducer ${verdict#fail }"
        failed+=("$rel $target (${verdict#fail })")
        ;;
    esac
    # After the verdict: these copies are no findings.
    learned="$cache/$pkg/$target"
    if [ -d "$learned" ]; then
      mkdir -p "$corpus"
      before=$(fuzz_list "$corpus" | wc -l)
      cp -n "$learned"/* "$corpus/" 2>/dev/null || true
      echo "   corpus: $(($(fuzz_list "$corpus" | wc -l) - before)) new inputs kept in $corpus"
    fi
  done
done

# joined ITEM...: the items separated by "; ".
joined() {
  local out="" item
  for item in "$@"; do
    out+="${out:+; }$item"
  done
  printf '%s' "$out"
}
summary="fuzz: $passed passed, ${#failed[@]} failed, ${#flaked[@]} flaked"
if [ "${#failed[@]}" -gt 0 ]; then
  summary+=" (failed: $(joined "${failed[@]}"))"
fi
if [ "${#flaked[@]}" -gt 0 ]; then
  summary+=" (flaked, skipped: $(joined "${flaked[@]}"))"
fi
echo "$summary; $fuzzedwith"
[ "${#failed[@]}" -eq 0 ]
