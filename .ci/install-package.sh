#!/usr/bin/env bash
# Installs a Debian package whose commands the tests run themselves
# (coturn's turnserver and turnutils_uclient, haproxy), unless every one of
# those commands is already on PATH:
#
#   install-package.sh PACKAGE SERVICE COMMAND...
#
# The package's own daemon (SERVICE) is never wanted here: the tests start
# the program on loopback ports they choose, and a system daemon would sit
# on a default port (coturn on 3478, where edgerelay's TURN listener
# defaults to), so it is kept from starting and disabled after the install.
set -euo pipefail

pkg=$1 service=$2
shift 2
missing=0
for cmd in "$@"; do
	command -v "$cmd" >/dev/null 2>&1 || missing=1
done
[ "$missing" = 0 ] && exit 0

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

# One apt-get update per CI run is enough for every package.
if [ ! -e /tmp/.edgerelay-apt-updated ]; then
	$SUDO apt-get update
	touch /tmp/.edgerelay-apt-updated
fi
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "$pkg"

# Belt and braces: whatever the init system, make sure no daemon of the
# package runs now or starts on boot. `systemctl disable` works without a
# running systemd too (it removes the unit's symlinks); stopping needs one.
if command -v systemctl >/dev/null 2>&1; then
	$SUDO systemctl disable "$service" >/dev/null 2>&1 || true
	if [ -d /run/systemd/system ]; then
		$SUDO systemctl stop "$service" >/dev/null 2>&1 || true
	fi
fi
if command -v update-rc.d >/dev/null 2>&1; then
	$SUDO update-rc.d "$service" disable >/dev/null 2>&1 || true
fi
if [ -x "/etc/init.d/$service" ]; then
	$SUDO "/etc/init.d/$service" stop >/dev/null 2>&1 || true
fi

for cmd in "$@"; do
	command -v "$cmd" >/dev/null
done
