#!/usr/bin/env bash
# Fast subset of bench/run.sh (about a minute after the build): target 1 with 5,000 requests,
# target 2, and target 3 at 5000r/s for 5 s. Exits non-zero when a ratio falls short.
# Raw outputs: bench/results/check-<time>/. Exit 0: all met; 1: a target failed; 2: error.
source "$(dirname "$0")/common.sh"
cd "$root/bench"
exec python3 -m ratebench check --nginx "$nginx" --module "$module" --root "$root" "$@"
