#!/usr/bin/env bash
# The README's test command: every test of the workspace against the vendored nginx.
#
#   scripts/test.sh                  install what the tests need, build, run them all
#   scripts/test.sh --test headers   arguments go to `cargo test` (here: one test file)
#
# Installs the Debian packages the build and the tests need when they are missing
# (scripts/install-missing.sh: with sudo unless root; apt-get starts no service meanwhile): the build's (as scripts/run-example.sh),
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

packages=(libclang-dev libpcre2-dev libssl-dev zlib1g-dev pkg-config make gcc
    curl ca-certificates redis-server redis-tools openssl chromium chromium-driver
    python3-grpcio tzdata)
scripts/install-missing.sh --no-services "${packages[@]}"

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
