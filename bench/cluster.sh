#!/usr/bin/env bash
# The cluster bench (docs/cluster.md): three nginx instances x 2 workers sharing one limit
# through a local redis-server, each sync interval (20/50/100/250 ms) offered 2x and 10x the
# limit, plus one instance taking all the traffic, Redis stopped (with the latency of a zone
# without `sync` served side by side), a Redis Cluster and the fleet without `sync`. About
# three minutes after the release build. Writes bench/results/cluster.md (committed).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench/cluster.sh needs redis-server" >&2; exit 1; }
# The release module in the vendored nginx of the release build (as bench/run.sh measures).
cargo build --release
module=$PWD/target/release/libngx_http_rate_limit_module.so
nginx=$(ls -dt "$PWD"/target/release/build/nginx-sys-*/out/objs/nginx | head -n 1)
TEST_NGINX_BINARY=$nginx RATE_LIMIT_MODULE=$module \
    cargo test --bench cluster -- --nocapture
