#!/usr/bin/env bash
# Builds the module and runs nginx in the foreground with an example config from nginx-conf/,
# on 127.0.0.1:8080 (and the admin API of nginx-conf/admin.conf on 127.0.0.1:8081), with the
# module loaded. Ctrl-C stops it.
#
#   scripts/run-example.sh [CONFIG]      CONFIG defaults to nginx-conf/basic.conf
#   PORT=9000 scripts/run-example.sh     another port (%%PORT%%)
#   ADMIN_PORT=9001 scripts/run-example.sh nginx-conf/admin.conf
#                                        another admin port (%%PORT2%%)
#
# Every run starts without the previous run's admin changes: a config's
# rate_limit_state_file is removed first, and the script says so. KEEP_STATE=1 keeps it
# (nginx then restores those changes at start, and the script says that instead).
#
# Installs the Debian packages the build needs when they are missing (with sudo unless root).
# nginx runs with the prefix target/run: its logs are in target/run/logs/, the files it serves
# in target/run/html/, and its error log is copied to the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."

config=${1:-nginx-conf/basic.conf}
port=${PORT:-8080}
admin_port=${ADMIN_PORT:-8081}
prefix=$PWD/target/run

[ -f "$config" ] || { echo "no such config: $config" >&2; exit 1; }

packages=(libclang-dev libpcre2-dev libssl-dev zlib1g-dev pkg-config make gcc)
missing=()
for package in "${packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    echo "installing ${missing[*]}" >&2
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# cargo's JSON messages say where the build put nginx (build.rs exports NGINX_BINARY) and
# the module.
messages=$(cargo build --message-format=json-render-diagnostics)
nginx=$(grep -o '"NGINX_BINARY","[^"]*"' <<<"$messages" | tail -n1 | cut -d'"' -f4)
module=$(grep -o '"[^"]*/libngx_http_rate_limit_module\.so"' <<<"$messages" | tail -n1 | tr -d '"')
[ -x "$nginx" ] || { echo "cargo build did not report the nginx binary" >&2; exit 1; }
[ -f "$module" ] || { echo "cargo build did not report the module" >&2; exit 1; }

mkdir -p "$prefix/logs" "$prefix/html"
[ -f "$prefix/html/index.html" ] || echo "ok" >"$prefix/html/index.html"
sed -e "s|%%MODULE%%|$module|g" -e "s|%%PORT%%|$port|g" -e "s|%%PORT1%%|$port|g" \
    -e "s|%%PORT2%%|$admin_port|g" -e "s|%%PREFIX%%|$prefix|g" \
    "$config" >"$prefix/nginx.conf"
if unknown=$(grep -o '%%[A-Z0-9_]*%%' "$prefix/nginx.conf" | head -n1) && [ -n "$unknown" ]; then
    echo "$config: unknown placeholder $unknown" >&2
    exit 1
fi

# A state file left by the previous run would silently bring back its admin changes.
state_file=$(sed -n 's/^[[:space:]]*rate_limit_state_file[[:space:]]\{1,\}\([^;[:space:]]*\);.*/\1/p' \
    "$prefix/nginx.conf" | head -n1)
if [ -n "$state_file" ]; then
    case $state_file in /*) ;; *) state_file=$prefix/$state_file ;; esac
    if [ ! -f "$state_file" ]; then
        :
    elif [ "${KEEP_STATE:-}" = 1 ]; then
        echo "KEEP_STATE=1: nginx restores the admin changes saved in $state_file" >&2
    else
        rm -f "$state_file"
        echo "removed $state_file: this run starts without the previous run's admin changes" \
            "(KEEP_STATE=1 keeps them)" >&2
    fi
fi

globals="daemon off; error_log stderr notice;"
# Workers run as 'nobody' under root, and may not be able to read a checkout in a home
# directory: this demo serves target/run/html as root instead.
[ "$(id -u)" -ne 0 ] || globals="$globals user root;"

admin=""
grep -q '%%PORT2%%' "$config" && admin=", admin API on http://127.0.0.1:$admin_port/"
echo "nginx on http://127.0.0.1:$port/$admin with $config (prefix $prefix); Ctrl-C stops it" >&2
exec "$nginx" -p "$prefix" -c nginx.conf -g "$globals"
