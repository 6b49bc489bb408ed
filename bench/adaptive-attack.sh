#!/usr/bin/env bash
# The adaptive limit under attack and on other upstreams (issue 27, point 6): a 20% slow-path
# attacker on one shared key (fixed limit=100 beside limit=adaptive), then capacity
# C -> C/4 -> C on a FIFO worker pool and on a bimodal one. About five minutes after the
# release build; run it under `flock /tmp/bench.lock` on a shared machine. Writes
# bench/results/adaptive-attack.md (committed); raw outputs in
# bench/results/adaptive-attack-<time>/.
# Exit 0: the targets were met; 1: they were not; 2: the bench could not run.
source "$(dirname "$0")/common.sh"
cd "$root/bench"
exec python3 -m ratebench.adaptive_attack --nginx "$nginx" --module "$module" --root "$root" \
    --write-summary "$@"
