#!/usr/bin/env bash
# Installs Debian's coturn package for the TURN interop test and benchmark
# (turnutils_uclient and turnserver), its daemon kept stopped; see
# install-package.sh.
set -euo pipefail
bash "$(dirname "$0")/install-package.sh" coturn coturn turnutils_uclient turnserver
# A daemon started despite install-package.sh runs as the turnserver user
# from the package's configuration; stop exactly those processes, by pid.
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
for pid in $(pgrep -x turnserver -u turnserver 2>/dev/null || true); do
	$SUDO kill "$pid" 2>/dev/null || true
done
