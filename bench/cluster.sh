#!/usr/bin/env bash
# The cluster bench (README "Cluster"): three nginx instances x 2 workers sharing one limit
# through a local redis-server, each sync interval (20/50/100/250 ms) offered 2x and 10x the
# limit, plus one instance taking all the traffic and the fleet without `sync`. About two
# minutes. Writes bench/results/cluster.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench/cluster.sh needs redis-server" >&2; exit 1; }
cargo build
cargo test --test cluster -- --ignored --exact bench_cluster_table --nocapture
