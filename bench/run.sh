#!/usr/bin/env bash
# The performance bench of issue 5: rate_limit next to native limit_req in the same nginx.
# Builds release, runs targets 1-5 (about 17 minutes on 2 cores), prints one table with the
# ratios and PASS/FAIL per target, and writes bench/results/latest.md.
# Raw outputs: bench/results/full-<time>/. Exit 0: all met; 1: a target failed; 2: error.
source "$(dirname "$0")/common.sh"
cd "$root/bench"
exec python3 -m ratebench full --nginx "$nginx" --module "$module" --root "$root" "$@"
