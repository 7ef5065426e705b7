#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when they are missing.
# Idempotent: a second run does nothing. Needs root (or passwordless sudo)
# only when something must be installed.
set -euo pipefail
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
has runuser || need+=(util-linux)
has promtool || need+=(prometheus)   # promtool checks /metrics output
has ip || need+=(iproute2)           # internal/testkit/netns, internal/testkit/e2e: namespaces and veth links
has nft || need+=(nftables)          # internal/testkit/e2e: blocked-UDP rules inside namespaces
has tinyproxy || need+=(tinyproxy)   # internal/testkit/e2e: the HTTP CONNECT proxy scenario
has squid || need+=(squid)           # internal/testkit/e2e: a stock enterprise proxy (basic auth, CONNECT to 443 only)
has openssl || need+=(openssl)       # internal/testkit/netns: squid's htpasswd entries (openssl passwd -1)
has systemd-analyze || need+=(systemd) # internal/testkit/release: systemd-analyze verify/security of packaging/systemd
has zsh || need+=(zsh)               # internal/cli: zsh -n on the generated completion
has fish || need+=(fish)             # internal/cli: fish --no-execute on the generated completion
has groff || need+=(groff-base)      # internal/cli: groff -ww on the generated man page
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
# Debian starts services on install; tests run their own throwaway ones.
$SUDO service postgresql stop >/dev/null 2>&1 || true
$SUDO service prometheus stop >/dev/null 2>&1 || true
$SUDO service tinyproxy stop >/dev/null 2>&1 || true
$SUDO service squid stop >/dev/null 2>&1 || true
