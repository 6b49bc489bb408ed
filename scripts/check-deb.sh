#!/usr/bin/env bash
# Checks a package made by scripts/package-deb.sh on this machine's own nginx, as a user would
# use it (CI runs this; run it as root):
#   1. apt-get install ./the.deb into the stock /etc/nginx; `nginx -t` passes;
#   2. a rate_limit_zone/rate_limit pair in /etc/nginx/conf.d/ passes `nginx -t`;
#   3. Debian's nginx started with the package's modules-enabled link and that conf.d file
#      (not the stock sites, which listen on port 80), on a free loopback port, answers
#      200 then 429 over HTTP;
#   4. without the pair, apt-get remove leaves a config that passes `nginx -t`.
# On exit, whatever happened: the nginx it started is stopped, the package purged, and
# /etc/nginx restored from a copy taken before.
#
#   scripts/check-deb.sh target/debian/libnginx-mod-http-rate-limit_<version>_<arch>.deb
set -euo pipefail

die() {
    echo "check-deb: FAILED: $*" >&2
    exit 1
}
say() { echo "check-deb: $*" >&2; }

deb=$(readlink -f "${1:?usage: $0 PACKAGE.deb}")
[ -f "$deb" ] || die "no such package: $1"
[ "$(id -u)" -eq 0 ] || die "run as root (it installs a package into /etc/nginx)"
package=$(dpkg-deb -f "$deb" Package)
nginx=/usr/sbin/nginx
[ -x "$nginx" ] || die "$nginx is missing: apt-get install nginx"
dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q '^install ok installed' &&
    die "$package is already installed: this check installs and purges it, remove it first"

scratch=$(mktemp -d)
chmod 755 "$scratch"
tar -C /etc -cpf "$scratch/etc-nginx.tar" nginx
apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=300)

cleanup() {
    local status=$?
    if [ -f "$scratch/nginx.pid" ]; then
        local pid
        pid=$(cat "$scratch/nginx.pid")
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    "${apt[@]}" purge "$package" >/dev/null 2>&1 || true
    rm -rf /etc/nginx
    tar -C /etc -xpf "$scratch/etc-nginx.tar"
    rm -rf "$scratch"
    say "/etc/nginx restored, $package purged"
    exit "$status"
}
trap cleanup EXIT

say "apt-get install $deb"
"${apt[@]}" install "$deb" >"$scratch/install.log" 2>&1 || { cat "$scratch/install.log" >&2; die "apt-get install"; }
link=/etc/nginx/modules-enabled/50-mod-http-rate-limit.conf
[ -L "$link" ] || die "$link is not a symlink after the install"
grep -qx 'load_module modules/ngx_http_rate_limit_module.so;' "$link" || die "$link: $(cat "$link")"
"$nginx" -t -q || die "nginx -t with the package installed"
say "installed; stock nginx.conf passes nginx -t"

# A free loopback port: one nothing answers on (nginx fails loudly if it was taken since).
port=
for _ in $(seq 20); do
    candidate=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
        port=$candidate
        break
    fi
done
[ -n "$port" ] || die "no free loopback port found"

pair=/etc/nginx/conf.d/rate-limit-check.conf
cat >"$pair" <<EOF
rate_limit_zone \$binary_remote_addr zone=deb_check:1m rate=1r/m;
server {
    listen 127.0.0.1:$port;
    location / {
        rate_limit zone=deb_check;
        empty_gif;
    }
}
EOF
"$nginx" -t -q || die "nginx -t with $pair"
say "the stock nginx.conf with $pair passes nginx -t"

# The stock config's modules and conf.d, without sites-enabled (port 80 is not ours to take);
# the default prefix, against which modules-enabled/*.conf name modules/*.so.
cat >"$scratch/nginx.conf" <<EOF
include /etc/nginx/modules-enabled/*.conf;
pid $scratch/nginx.pid;
error_log $scratch/error.log;
events {}
http {
    include /etc/nginx/mime.types;
    access_log off;
    client_body_temp_path $scratch/client_body;
    proxy_temp_path $scratch/proxy;
    fastcgi_temp_path $scratch/fastcgi;
    uwsgi_temp_path $scratch/uwsgi;
    scgi_temp_path $scratch/scgi;
    include /etc/nginx/conf.d/*.conf;
}
EOF
"$nginx" -c "$scratch/nginx.conf" -e "$scratch/error.log" ||
    { cat "$scratch/error.log" >&2; die "Debian's nginx did not start"; }
statuses=""
for _ in 1 2 3; do
    statuses="$statuses $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")"
done
# rate=1r/m, no burst: the first request passes, the next two (within the same minute) are
# rejected at once with the module's default status, 429. (With a burst and without nodelay,
# requests over the rate would be delayed to it, not rejected.)
expected=" 200 429 429"
say "Debian's nginx on 127.0.0.1:$port, rate=1r/m without burst, three requests:"
say "  expected:$expected (the first passes, the next two are over the rate)"
say "  seen:    $statuses"
[ "$statuses" = "$expected" ] || die "expected$expected, seen$statuses"

kill -QUIT "$(cat "$scratch/nginx.pid")"
for _ in $(seq 50); do [ -f "$scratch/nginx.pid" ] || break; sleep 0.1; done
[ ! -f "$scratch/nginx.pid" ] || die "nginx did not quit"

rm "$pair"
say "apt-get remove $package"
"${apt[@]}" remove "$package" >"$scratch/remove.log" 2>&1 || { cat "$scratch/remove.log" >&2; die "apt-get remove"; }
[ ! -e "$link" ] || die "$link is still enabled after the remove"
"$nginx" -t -q || die "nginx -t after apt-get remove"
say "removed; nginx -t passes: OK"
