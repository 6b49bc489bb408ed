# Sourced by run.sh and check.sh: install the tools, build release, find the binaries.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# valgrind (callgrind, callgrind_annotate) and wrk from Debian; python3 for the driver.
missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v wrk >/dev/null || missing+=(wrk)
command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    echo "installing ${missing[*]}" >&2
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "the bench runs nginx with 'user root;': run it as root" >&2
    exit 2
fi

echo "building release (cargo build --release)" >&2
cargo build --release -q
module=$root/target/release/libngx_http_rate_limit_module.so
# The vendored nginx the build made; the newest if several build directories exist.
nginx=$(ls -dt "$root"/target/release/build/nginx-sys-*/out/objs/nginx | head -n 1)
[ -x "$nginx" ] && [ -f "$module" ] || { echo "no nginx or module after the build" >&2; exit 2; }
