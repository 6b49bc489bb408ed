#!/usr/bin/env bash
# Stream limits against HAProxy (issue 30): Debian's nginx with this module and Debian's
# HAProxy, both at 10 new connections a second per address, an attacker and 50 well-behaved
# clients (bench/ratebench/stream.py). Writes bench/results/stream.md (committed).
# Runs under `flock /tmp/bench.lock` so that two benches never overlap. Needs root (nginx runs
# `user root;`), Debian's nginx with libnginx-mod-stream, and haproxy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
nginx=${NGINX:-/usr/sbin/nginx}
command -v haproxy >/dev/null || { echo "haproxy is missing: apt-get install haproxy" >&2; exit 2; }
module=$(scripts/build-for-nginx.sh "$nginx" | sed -n 's/^load_module \(.*\);$/\1/p')
[ -f "$module" ] || { echo "scripts/build-for-nginx.sh did not report the module" >&2; exit 2; }
cd bench
exec flock /tmp/bench.lock python3 -m ratebench.stream --nginx "$nginx" --module "$module" \
    --write-summary "$root/bench/results/stream.md" "$@"
