# Sourced by fuzz/run.sh (and its test, fuzz/run_test.go): the verdict on
# one fuzz target's run.
#
# A red `make fuzz` must mean a finding. Go's fuzz coordinator in Go 1.26
# and older can fail a target at the end of a duration -fuzztime with a bare
# "context deadline exceeded" and nothing found (golang/go#75804, fixed in
# Go 1.27): the deadline's parent context is seen cancelled before its
# child. A finding always leaves a reproducer: Go writes the failing input
# under the package's testdata/fuzz/<Target>/ and prints "Failing input
# written to" before failing.

# fuzz_list DIR: the names in DIR, one a line; nothing when DIR is missing.
fuzz_list() {
  if [ -d "$1" ]; then
    ls -A "$1"
  fi
}

# fuzz_deadline_only LOG TARGET: true when LOG, the output of a failed run
# of TARGET, says nothing but the coordinator's deadline error: progress
# lines, the FAIL lines go test prints around any failure, and "context
# deadline exceeded" as the target's one reason. Anything else (a seed
# corpus entry failing, a build error, a worker that died, a panic) is not
# this flake.
fuzz_deadline_only() {
  local line seen=0
  while IFS= read -r line || [ -n "$line" ]; do
    line="${line%"${line##*[![:space:]]}"}" # trailing blanks
    case $line in
      "" | "fuzz: elapsed: "* | "warning: starting with empty corpus") ;;
      "--- FAIL: $2 ("*"s)" | FAIL | FAIL$'\t'* | "exit status "[0-9]*) ;;
      *)
        if [[ $line =~ ^[[:space:]]+context\ deadline\ exceeded$ ]]; then
          seen=1
        else
          return 1
        fi
        ;;
    esac
  done <"$1"
  [ "$seen" = 1 ]
}

# fuzz_classify RC LOG BEFORE PKGDIR TARGET prints the verdict on one run:
#   "fail FILE..."  reproducers this run wrote under PKGDIR/testdata/fuzz/TARGET
#                   (names not in the file BEFORE, the listing taken before
#                   the run, and any file named by "Failing input written to")
#   "fail"          a non-zero exit with no reproducer for another reason
#                   (build error, failing seed corpus entry, ...): see LOG
#   "flake"         a non-zero exit that is only the coordinator's deadline
#   "pass"          exit 0 and nothing written
# RC is go test's exit status and LOG its output. Run it before the corpus
# inputs Go kept in its cache are copied into the same directory.
fuzz_classify() {
  local rc=$1 log=$2 before=$3 corpus="$4/testdata/fuzz/$5"
  local -a repro=()
  local name written
  while IFS= read -r name; do
    repro+=("$corpus/$name")
  done < <(LC_ALL=C comm -13 <(LC_ALL=C sort "$before") <(fuzz_list "$corpus" | LC_ALL=C sort))
  while IFS= read -r written; do
    written="$4/${written%"${written##*[![:space:]]}"}"
    if [[ " ${repro[*]} " != *" $written "* ]]; then
      repro+=("$written")
    fi
  done < <(sed -n 's/^[[:space:]]*Failing input written to //p' "$log")
  if [ "${#repro[@]}" -gt 0 ]; then
    echo "fail ${repro[*]}"
  elif [ "$rc" = 0 ]; then
    echo pass
  elif fuzz_deadline_only "$log" "$5"; then
    echo flake
  else
    echo fail
  fi
}
