#!/usr/bin/env bash
# Builds the module and runs nginx in the foreground with an example config from nginx-conf/,
# on 127.0.0.1:8080 (and the config's other ports: nginx-conf/admin.conf's admin API on
# 127.0.0.1:8081), with the module loaded, and says where the config's admin API is, if it has
# one. A port already in use is named, with the variable that chooses another. Ctrl-C stops it.
#
#   scripts/run-example.sh [CONFIG]      CONFIG defaults to nginx-conf/basic.conf
#   PORT=9000 scripts/run-example.sh     another port (%%PORT%%)
#   ADMIN_PORT=9001 scripts/run-example.sh nginx-conf/admin.conf
#                                        another admin port (%%PORT2%%)
#   INSTANCE=2 PORT=8082 scripts/run-example.sh nginx-conf/cluster.conf
#                                        a second instance beside the first: its own prefix,
#                                        target/run-2 (the default instance's is target/run)
#   REDIS_URL=redis://10.0.0.5:6379 scripts/run-example.sh nginx-conf/cluster.conf
#                                        the Redis of %%REDIS%% (default redis://127.0.0.1:6379;
#                                        when nothing answers there, the script starts a
#                                        redis-server on it, installing it if missing)
#   NGINX=/usr/sbin/nginx scripts/run-example.sh nginx-conf/lua.conf
#                                        another nginx (here Debian's, which its Lua module is
#                                        built for): the module is built for it by
#                                        scripts/build-for-nginx.sh
#   MODULE=/path/to/ngx_http_rate_limit_module.so   with NGINX=: a module already built for it
#   PREFIX=/tmp/example                  another prefix (absolute)
#   UPSTREAM_PORT=2525 scripts/run-example.sh nginx-conf/stream-smtp.conf
#                                        the port of the stream examples' stand-in upstream
#                                        (%%PORT3%%, default 8082: the mail server, the
#                                        resolver, which the configs themselves serve)
#
# Every run starts without the previous run's admin changes: a config's
# rate_limit_state_file is removed first, and the script says so. KEEP_STATE=1 keeps it
# (nginx then restores those changes at start, and the script says that instead).
#
# Installs the Debian packages the build needs when they are missing
# (scripts/install-missing.sh, with sudo unless root).
# nginx runs with the prefix target/run (or target/run-$INSTANCE): its logs are in logs/ there,
# the files it serves in html/, and its error log is copied to the terminal.
#
# Placeholders of the configs: %%MODULE%% (the module's absolute path), %%PORT%% (= %%PORT1%%),
# %%PORT2%%, %%PREFIX%% (the prefix), %%REPO%% (this checkout, for lua_package_path),
# %%REDIS%% (the Redis URL).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "run-example: $*" >&2; }
die() {
    say "$*"
    exit 1
}

config=${1:-nginx-conf/basic.conf}
port=${PORT:-8080}
admin_port=${ADMIN_PORT:-8081}
prefix=${PREFIX:-$PWD/target/run${INSTANCE:+-$INSTANCE}}

[ -f "$config" ] || die "no such config: $config"

# Installs the Debian packages given that are missing.
install_missing() { scripts/install-missing.sh "$@"; }

# A config that loads Debian's Lua module needs the nginx it is built for.
if grep -q '^[[:space:]]*load_module[[:space:]].*ngx_http_lua_module\.so' "$config" &&
    [ -z "${NGINX:-}" ]; then
    die "$config loads Debian's Lua module, which only Debian's nginx can load:
    apt-get install nginx libnginx-mod-http-lua lua-resty-core dpkg-dev
    NGINX=/usr/sbin/nginx $0 $config"
fi

if [ -z "${NGINX:-}" ]; then
    [ -z "${MODULE:-}" ] || die "MODULE=$MODULE needs the nginx it was built for: set NGINX too"
    install_missing libclang-dev libpcre2-dev libssl-dev zlib1g-dev pkg-config make gcc
    # cargo's JSON messages say where the build put nginx (build.rs exports NGINX_BINARY) and
    # the module.
    messages=$(cargo build --message-format=json-render-diagnostics)
    nginx=$(grep -o '"NGINX_BINARY","[^"]*"' <<<"$messages" | tail -n1 | cut -d'"' -f4)
    module=$(grep -o '"[^"]*/libngx_http_rate_limit_module\.so"' <<<"$messages" | tail -n1 | tr -d '"')
    [ -x "$nginx" ] || die "cargo build did not report the nginx binary"
    [ -f "$module" ] || die "cargo build did not report the module"
else
    nginx=$(command -v "$NGINX" || true)
    [ -n "$nginx" ] && [ -x "$nginx" ] || die "NGINX=$NGINX is not an executable"
    if [ -n "${MODULE:-}" ]; then
        module=$(readlink -f "$MODULE")
        [ -f "$module" ] || die "MODULE=$MODULE does not exist"
    else
        install_missing libclang-dev libpcre2-dev libssl-dev zlib1g-dev pkg-config make gcc dpkg-dev
        say "building the module for $nginx (scripts/build-for-nginx.sh)"
        module=$(scripts/build-for-nginx.sh "$nginx" | sed -n 's/^load_module \(.*\);$/\1/p')
        [ -f "$module" ] || die "scripts/build-for-nginx.sh did not report the module"
    fi
fi

# Whether a Redis answers PING at host $1, port $2 (an AUTH error is an answer too).
redis_answers() {
    local reply=""
    { exec 3<>"/dev/tcp/$1/$2"; } 2>/dev/null || return 1
    printf 'PING\r\n' >&3
    read -r -t 2 reply <&3 || true
    exec 3<&- 3>&-
    [[ $reply == +PONG* || $reply == -NOAUTH* || $reply == -WRONGPASS* ]]
}

redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
if grep -q '%%REDIS%%' "$config" && [ -z "${REDIS_URL:-}" ] && ! redis_answers 127.0.0.1 6379; then
    install_missing redis-server
    # Debian's package starts a service where systemd runs; elsewhere (a container) it does not.
    if ! redis_answers 127.0.0.1 6379; then
        mkdir -p target/redis
        redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$PWD/target/redis" --logfile "$PWD/target/redis/redis.log" \
            --pidfile "$PWD/target/redis/redis.pid" --daemonize yes
        for _ in $(seq 50); do
            redis_answers 127.0.0.1 6379 && break
            sleep 0.1
        done
        redis_answers 127.0.0.1 6379 || die "redis-server did not start: see target/redis/redis.log"
        say "started redis-server on 127.0.0.1:6379 (it keeps running; stop it with" \
            "redis-cli -p 6379 shutdown)"
    fi
fi

# Whether something listens on 127.0.0.1:$1 (TCP or UDP).
port_busy() {
    if command -v ss >/dev/null; then
        [ -n "$(ss -Htuln "sport = :$1" 2>/dev/null)" ]
    else
        { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null && exec 3<&- 3>&-
    fi
}
# A port the config listens on that is taken would only get nginx's bind() error: say which
# variable chooses another.
check_port() {
    local placeholder=$1 value=$2 variable=$3
    grep -q "$placeholder" "$config" || return 0
    port_busy "$value" || return 0
    die "port $value is in use (something listens on 127.0.0.1:$value, maybe an earlier run of
    this script, or a test's nginx): stop it, or choose another port for $placeholder:
    $variable=$((value < 64535 ? value + 1000 : value - 1000)) $0 $config"
}
check_port '%%PORT%%' "$port" PORT
check_port '%%PORT1%%' "$port" PORT
check_port '%%PORT2%%' "$admin_port" ADMIN_PORT
check_port '%%PORT3%%' "${UPSTREAM_PORT:-8082}" UPSTREAM_PORT

mkdir -p "$prefix/logs" "$prefix/html"
[ -f "$prefix/html/index.html" ] || echo "ok" >"$prefix/html/index.html"
sed -e "s|%%MODULE%%|$module|g" -e "s|%%PORT%%|$port|g" -e "s|%%PORT1%%|$port|g" \
    -e "s|%%PORT2%%|$admin_port|g" -e "s|%%PREFIX%%|$prefix|g" -e "s|%%REPO%%|$PWD|g" \
    -e "s|%%REDIS%%|$redis_url|g" -e "s|%%PORT3%%|${UPSTREAM_PORT:-8082}|g" \
    "$config" >"$prefix/nginx.conf"
# The stream examples' commented load_module line, for an nginx whose stream module is a
# dynamic module (Debian's libnginx-mod-stream): uncommented, from the binary's modules path.
if "$nginx" -V 2>&1 | grep -q -- '--with-stream=dynamic'; then
    modules_path=$("$nginx" -V 2>&1 | tr ' ' '\n' | sed -n 's/^--modules-path=//p')
    sed -i "s|^#load_module modules/ngx_stream_module.so;|load_module ${modules_path:-modules}/ngx_stream_module.so;|" \
        "$prefix/nginx.conf"
fi
if unknown=$(grep -o '%%[A-Z0-9_]*%%' "$prefix/nginx.conf" | head -n1) && [ -n "$unknown" ]; then
    die "$config: unknown placeholder $unknown"
fi

# A state file left by the previous run would silently bring back its admin changes.
state_file=$(sed -n 's/^[[:space:]]*rate_limit_state_file[[:space:]]\{1,\}\([^;[:space:]]*\);.*/\1/p' \
    "$prefix/nginx.conf" | head -n1)
if [ -n "$state_file" ]; then
    case $state_file in /*) ;; *) state_file=$prefix/$state_file ;; esac
    if [ ! -f "$state_file" ]; then
        :
    elif [ "${KEEP_STATE:-}" = 1 ]; then
        say "KEEP_STATE=1: nginx restores the admin changes saved in $state_file"
    else
        rm -f "$state_file"
        say "removed $state_file: this run starts without the previous run's admin changes" \
            "(KEEP_STATE=1 keeps them)"
    fi
fi

# The pid file in the prefix: a packaged nginx's own default (/run/nginx.pid) belongs to the
# system's nginx.
globals="daemon off; error_log stderr notice; pid logs/nginx.pid;"
# Workers run as 'nobody' under root, and may not be able to read a checkout in a home
# directory: this demo serves target/run/html as root instead.
[ "$(id -u)" -ne 0 ] || globals="$globals user root;"

# The admin API's URL: the location with rate_limit_admin, on its server's listen port.
admin=$(awk '
    $1 == "listen" { listen = $2; sub(/;$/, "", listen) }
    $1 == "location" { location = ($2 == "=" ? $3 : $2) }
    $1 ~ /^rate_limit_admin/ { print "http://" listen location; exit }
' "$prefix/nginx.conf")
say "nginx on http://127.0.0.1:$port/ with $config (prefix $prefix); Ctrl-C stops it"
[ -z "$admin" ] || say "the admin API: $admin"
say "nginx: $nginx; module: $module"
say "nginx's messages name $prefix/nginx.conf: $config with the placeholders filled in," \
    "line for line (the same line numbers)"
# nginx reads an NGINX environment variable of its own (the sockets a binary upgrade hands over).
unset NGINX
exec "$nginx" -p "$prefix" -c nginx.conf -g "$globals"
