#!/usr/bin/env bash
# Installs the Debian packages named that are not installed yet (with sudo unless root), one
# apt-get run for all of them; nothing to do, no apt-get at all.
#
#   scripts/install-missing.sh [--no-services] PACKAGE...
#
# --no-services: no package starts a service while apt-get runs (Debian's nginx would take
# port 80, redis-server port 6379): a policy-rc.d that denies starts is put in place when the
# machine has none, and removed afterwards. scripts/test.sh and .ci/run use it so;
# scripts/run-example.sh does not, where a started redis-server is what it wants.
set -euo pipefail

say() { echo "install-missing: $*" >&2; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo

no_services=""
if [ "${1:-}" = --no-services ]; then
    no_services=yes
    shift
fi
missing=()
for package in "$@"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
((${#missing[@]})) || exit 0
say "installing ${missing[*]}"

policy=/usr/sbin/policy-rc.d
policy_added=""
if [ -n "$no_services" ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    policy_added=yes
fi
status=0
$sudo apt-get update -q &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" || status=$?
[ -z "$policy_added" ] || $sudo rm -f "$policy"
[ "$status" -eq 0 ] || { say "apt-get failed ($status): install ${missing[*]} by hand"; exit 1; }
