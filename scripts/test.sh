#!/usr/bin/env bash
# The README's test command: every test of the workspace against the vendored nginx.
#
#   scripts/test.sh                  install what the tests need, build, run them all
#   scripts/test.sh --test headers   arguments go to `cargo test` (here: one test file)
#
# Installs the Debian packages the build and the tests need when they are missing (with sudo
# unless root; apt-get starts no service meanwhile): the build's (as scripts/run-example.sh),
# curl, redis-server and redis-tools (the fleet tests' own servers on free ports), openssl
# (their TLS certificates), chromium and chromium-driver (the dashboard), python3-grpcio (a
# real gRPC server and client), tzdata (quota zones' time zones). Then
# `cargo build && cargo test --workspace --no-fail-fast`.
#
# What this pass skips (t/common/skip.rs), unless RATE_LIMIT_TEST_SKIP says otherwise: `lua`
# (Debian's Lua module does not load into the vendored nginx; CI runs those tests against
# Debian's nginx), and `debian-nginx` when Debian's nginx is not installed (installing it
# would start a service on port 80: `apt-get install nginx` runs those tests too).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "test.sh: $*" >&2; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo

packages=(libclang-dev libpcre2-dev libssl-dev zlib1g-dev pkg-config make gcc
    curl ca-certificates redis-server redis-tools openssl chromium chromium-driver
    python3-grpcio tzdata)
missing=()
for package in "${packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    # No service started by the packages (redis-server's) while apt-get runs: a policy-rc.d
    # that denies starts, when the machine has none, removed afterwards.
    policy=/usr/sbin/policy-rc.d
    policy_added=""
    if [ ! -e "$policy" ]; then
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
fi

if [ -z "${RATE_LIMIT_TEST_SKIP+set}" ]; then
    RATE_LIMIT_TEST_SKIP=lua
    if [ ! -x /usr/sbin/nginx ]; then
        RATE_LIMIT_TEST_SKIP=lua,debian-nginx
        say "Debian's nginx is not installed: its tests are skipped (debian-nginx)"
    fi
fi
export RATE_LIMIT_TEST_SKIP
say "RATE_LIMIT_TEST_SKIP=$RATE_LIMIT_TEST_SKIP"

cargo build
exec cargo test --workspace --no-fail-fast "$@"
