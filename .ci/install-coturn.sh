#!/usr/bin/env bash
# Installs Debian's coturn package for the TURN interop test and benchmark
# (turnutils_uclient and turnserver), unless turnutils_uclient is already
# on PATH. The package's own daemon is never wanted here: the tests and the
# benchmark start turnserver themselves on loopback ports they choose, and a
# system turnserver would sit on 3478 (the port edgerelay's TURN listener
# defaults to), so the service is stopped and disabled after the install.
set -euo pipefail

if command -v turnutils_uclient >/dev/null 2>&1; then
	exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	SUDO="sudo"
fi

# policy-rc.d exit status 101 tells invoke-rc.d not to start any service
# while the package installs; it is removed again on exit if we put it there.
POLICY=/usr/sbin/policy-rc.d
placed_policy=0
if [ ! -e "$POLICY" ]; then
	printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
	$SUDO chmod +x "$POLICY"
	placed_policy=1
fi
cleanup() {
	if [ "$placed_policy" = 1 ]; then
		$SUDO rm -f "$POLICY"
	fi
}
trap cleanup EXIT

$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y coturn

# Belt and braces: whatever the init system, make sure no coturn daemon
# runs now or starts on boot. `systemctl disable` works without a running
# systemd too (it removes the unit's symlinks); stopping needs one.
if command -v systemctl >/dev/null 2>&1; then
	$SUDO systemctl disable coturn >/dev/null 2>&1 || true
	if [ -d /run/systemd/system ]; then
		$SUDO systemctl stop coturn >/dev/null 2>&1 || true
	fi
fi
if command -v update-rc.d >/dev/null 2>&1; then
	$SUDO update-rc.d coturn disable >/dev/null 2>&1 || true
fi
if [ -x /etc/init.d/coturn ]; then
	$SUDO /etc/init.d/coturn stop >/dev/null 2>&1 || true
fi
# A daemon started despite the above runs as the turnserver user from the
# package's configuration; stop exactly those processes, by pid.
for pid in $(pgrep -x turnserver -u turnserver 2>/dev/null || true); do
	$SUDO kill "$pid" 2>/dev/null || true
done

command -v turnutils_uclient >/dev/null
command -v turnserver >/dev/null
