#!/usr/bin/env bash
# A stand-in for the go command, for fuzz/run_test.go: it answers the calls
# fuzz/run.sh makes, from files under $FAKEGO (no compiling, no fuzzing).
#   $FAKEGO/installed        the installed Go's version (go1.26.8)
#   $FAKEGO/fetchable        toolchains `GOTOOLCHAIN=X go version` can get, one a line
#   $FAKEGO/packages         import path and directory (under the cwd) per line
#   $FAKEGO/targets/PKGDIR   the fuzz targets of a package, one a line
#   $FAKEGO/runs/TARGET/out  what `go test -fuzz ^TARGET$` prints
#   $FAKEGO/runs/TARGET/rc   its exit status (default 0)
#   $FAKEGO/runs/TARGET/write  names it writes under PKGDIR/testdata/fuzz/TARGET (a crasher)
#   $FAKEGO/runs/TARGET/learn  names it leaves in the cache's fuzz/PKG/TARGET
# Every `go test -fuzz` call is logged to $FAKEGO/calls with its GOTOOLCHAIN.
set -euo pipefail
f=$FAKEGO
version() {
  case ${GOTOOLCHAIN:-local} in
    local) cat "$f/installed" ;;
    *) echo "$GOTOOLCHAIN" ;;
  esac
}
dir_of() { awk -v p="$1" '$1 == p { print $2 }' "$f/packages"; }
case "${1:-} ${2:-}" in
  "version "*)
    if [ "${GOTOOLCHAIN:-local}" != local ] && ! grep -qx "$GOTOOLCHAIN" "$f/fetchable" 2>/dev/null; then
      echo "go: download $GOTOOLCHAIN for linux/amd64: toolchain not available" >&2
      exit 1
    fi
    echo "go version $(version) linux/amd64"
    ;;
  "env GOVERSION") version ;;
  "env GOCACHE") echo "$f/cache" ;;
  "list -f") echo "$PWD/$(dir_of "$4")" ;;
  "list "*) awk '{ print $1 }' "$f/packages" ;;
  "test -list") cat "$f/targets/$(dir_of "$4")" ;;
  "test -run")
    target=${5#^}
    target=${target%$}
    pkg=${!#}
    run="$f/runs/$target"
    echo "$target GOTOOLCHAIN=${GOTOOLCHAIN:-}" >>"$f/calls"
    if [ -f "$run/learn" ]; then
      mkdir -p "$f/cache/fuzz/$pkg/$target"
      while read -r name; do echo "go test fuzz v1" >"$f/cache/fuzz/$pkg/$target/$name"; done <"$run/learn"
    fi
    if [ -f "$run/write" ]; then
      mkdir -p "$(dir_of "$pkg")/testdata/fuzz/$target"
      while read -r name; do echo "go test fuzz v1" >"$(dir_of "$pkg")/testdata/fuzz/$target/$name"; done <"$run/write"
    fi
    cat "$run/out" 2>/dev/null || true
    exit "$(cat "$run/rc" 2>/dev/null || echo 0)"
    ;;
  *)
    echo "fakego: unexpected call: go $*" >&2
    exit 3
    ;;
esac
