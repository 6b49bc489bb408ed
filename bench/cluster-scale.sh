#!/usr/bin/env bash
# The scale bench of rate_limit_sync (issue 18): distinct keys (1k, 10k, 100k a second) x
# instances (1, 2, 3) -> Redis commands and bytes per request, round duration, loop CPU and
# memory, p99 with and without sync; recovery after 0.5 s and 5 s Redis stalls; small bursts
# against one nginx; a hot key far under its limit. About six minutes after the release build,
# scaled down for a shared 2-core machine. Writes bench/results/cluster-scale.md (committed).
#   CLUSTER_SCALE_ONLY=keys,stalls,bursts,far   run some parts only
#   CLUSTER_SCALE_LABEL="..."                    a note for the table's last line
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in redis-server wrk; do
    command -v "$tool" >/dev/null || { echo "bench/cluster-scale.sh needs $tool" >&2; exit 1; }
done
# The release module in the vendored nginx of the release build (as bench/run.sh measures),
# unless RATE_LIMIT_MODULE and TEST_NGINX_BINARY name others.
if [ -z "${RATE_LIMIT_MODULE:-}" ]; then
    cargo build --release
    RATE_LIMIT_MODULE=$PWD/target/release/libngx_http_rate_limit_module.so
    TEST_NGINX_BINARY=$(ls -dt "$PWD"/target/release/build/nginx-sys-*/out/objs/nginx | head -n 1)
fi
export RATE_LIMIT_MODULE TEST_NGINX_BINARY
cargo test --bench cluster_scale -- --nocapture
