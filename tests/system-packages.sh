#!/usr/bin/env bash
# Installs the Debian packages that the test suite drives for real (Prometheus, Redis, a forward
# proxy, a headless browser, ...), listed one per line in tests/system-packages.txt.
# Only what is missing is installed, so a machine that has them all pays nothing.
set -euo pipefail
cd "$(dirname "$0")"
missing=()
while read -r pkg _; do
  case "$pkg" in ""|\#*) continue ;; esac
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < system-packages.txt
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages for the tests: ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
