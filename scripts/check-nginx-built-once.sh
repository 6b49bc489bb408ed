#!/usr/bin/env bash
# Checks that the README's commands configure and compile the vendored nginx once: `cargo
# build`, `cargo test --workspace` and `cargo test --test NAME` must share one nginx-sys build
# directory, and a `cargo build` after them must rebuild nothing.
#
#   scripts/check-nginx-built-once.sh           in a checkout whose target/ only the README's
#                                               commands (and clippy) have used: CI's clone
#   scripts/check-nginx-built-once.sh --fresh   clones HEAD into a temporary directory and runs
#                                               `cargo build && cargo test --workspace --no-run`
#                                               there first (a full build: ~10 minutes on 2 cores)
#
# What breaks it: a build dependency of nginx-sys (bindgen, regex...) that gets another hash
# when dev-dependencies are active; see [profile.dev.build-override] in Cargo.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --fresh ]; then
    clone=$(mktemp -d)
    trap 'rm -rf "$clone"' EXIT
    git clone --quiet "$PWD" "$clone/repo"
    cd "$clone/repo"
    unset CARGO_TARGET_DIR
    echo "fresh clone in $PWD: cargo build && cargo test --workspace --no-run" >&2
    cargo build --quiet && cargo test --workspace --no-run --quiet
fi

target=$(cargo metadata --format-version 1 --no-deps | grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
failed=0
dirs=()
# Each command as the README (or a developer running one test file) types it, after the
# README's commands already ran: nothing may be rebuilt, and nginx-sys's directory is one.
for command in "cargo build" "cargo test --workspace --no-run" "cargo test --test examples --no-run" "cargo build"; do
    messages=$($command --message-format=json 2>/dev/null)
    dir=$(grep -o '"package_id":"[^"]*nginx-sys[^"]*","linked_libs[^}]*"out_dir":"[^"]*"' <<<"$messages" |
        grep -o '"out_dir":"[^"]*"' | cut -d'"' -f4 | sort -u)
    rebuilt=$(grep '"reason":"compiler-artifact"' <<<"$messages" | grep '"fresh":false' |
        grep -o '"target":{[^}]*"name":"[^"]*"' | grep -o '"name":"[^"]*"$' | cut -d'"' -f4 | tr '\n' ' ' || true)
    echo "$command: nginx-sys in ${dir:-?}${rebuilt:+; rebuilt: $rebuilt}" >&2
    [ -n "$dir" ] && dirs+=("$dir")
    if [ -n "$rebuilt" ]; then
        echo "FAIL: \`$command\` rebuilt $rebuilt after the README's commands" >&2
        failed=1
    fi
done
distinct=$(printf '%s\n' "${dirs[@]}" | sort -u | wc -l)
if [ "${#dirs[@]}" -ne 4 ] || [ "$distinct" -ne 1 ]; then
    echo "FAIL: the commands used $distinct nginx-sys build directories (want 1)" >&2
    failed=1
fi
# nginx configured (objs/Makefile) in how many dev-profile build directories of this target/.
configured=$(find "$target/debug/build" -path '*/nginx-sys-*/out/objs/Makefile' 2>/dev/null | wc -l)
echo "nginx configured and compiled in $configured debug build directories of $target" >&2
if [ "$configured" -ne 1 ]; then
    echo "FAIL: nginx was configured $configured times (want 1; on a reused target/, run with --fresh)" >&2
    failed=1
fi
[ "$failed" -eq 0 ] && echo "ok: nginx configured and compiled once" >&2
exit "$failed"
