#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when they are missing.
# Idempotent: a second run does nothing. Needs root (or passwordless sudo)
# only when something must be installed.
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)   # promtool checks /metrics output
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
# Debian starts a cluster on install; tests run their own throwaway server.
$SUDO service postgresql stop >/dev/null 2>&1 || true
$SUDO service prometheus stop >/dev/null 2>&1 || true
