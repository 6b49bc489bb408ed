#!/usr/bin/env bash
# Protect the upstream (issue 23): a synthetic upstream that collapses under overload, behind
# nginx with no limiter, limit_req, a fixed concurrency limit and the adaptive one, in turn;
# its capacity halves mid-run. About three minutes after the release build. Writes
# bench/results/protect.md (committed); raw outputs in bench/results/protect-<time>/.
# Exit 0: the adaptive limit met its targets; 1: it did not; 2: the bench could not run.
source "$(dirname "$0")/common.sh"
cd "$root/bench"
exec python3 -m ratebench.protect --nginx "$nginx" --module "$module" --root "$root" \
    --write-summary "$@"
