#!/usr/bin/env bash
# Builds libnginx-mod-http-rate-limit_<version>_<arch>.deb for the nginx package installed on
# this Debian/Ubuntu machine, laid out as Debian's own libnginx-mod-http-* packages:
#
#   /usr/lib/nginx/modules/ngx_http_rate_limit_module.so
#   /usr/share/nginx/modules-available/mod-http-rate-limit.conf   (its load_module line)
#   /etc/nginx/modules-enabled/50-mod-http-rate-limit.conf         (symlink made by postinst)
#   /usr/bin/ratelimit-replay
#   /usr/share/lua/5.1/resty/rate_limit.lua   (the Lua API, where lua-resty-core's modules are)
#
# and Depends: on the nginx-abi-<version>-<n> that the installed nginx package provides, so apt
# refuses to install it next to an nginx it was not built for. The one .so holds the stream part
# too (docs/stream.md): it needs libnginx-mod-stream only where a stream block uses it, hence
# Suggests:, not Depends:.
#
#   scripts/package-deb.sh [NGINX_BINARY]    NGINX_BINARY defaults to the nginx on PATH
#
# The module is built by scripts/build-for-nginx.sh. The .deb is written to target/debian/ and
# its path is the only line printed on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "package-deb: $*" >&2
    exit 1
}

binary=${1:-$(command -v nginx || true)}
[ -n "$binary" ] || die "no nginx on PATH: give the nginx binary as the first argument"
binary=$(readlink -f "$binary")
command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (Debian/Ubuntu only)"

owner=$(dpkg-query -S "$binary" 2>/dev/null | head -n1) ||
    die "$binary is not from a Debian package: use scripts/build-for-nginx.sh and load_module"
nginx_package=${owner%%:*}
abi=$(dpkg-query -W -f='${Provides}' "$nginx_package" | tr ',' '\n' |
    sed -n 's/^[[:space:]]*\(nginx-abi-[^[:space:]]*\).*/\1/p' | head -n1)
[ -n "$abi" ] || die "the package $nginx_package provides no nginx-abi-*: cannot pin the module to it"

load_line=$(scripts/build-for-nginx.sh "$binary")
module=$(sed -n 's/^load_module \(.*\);$/\1/p' <<<"$load_line")
[ -f "$module" ] || die "scripts/build-for-nginx.sh did not report a module"
# ratelimit-replay has no nginx in it: the ordinary release build.
cargo build --release -p ratelimit-replay >&2
replay=target/release/ratelimit-replay

version=$(cargo metadata --format-version 1 --no-deps |
    grep -o '"name":"ngx-rate-limit","version":"[^"]*"' | sed 's/.*"version":"\(.*\)"/\1/')
[ -n "$version" ] || die "cannot read the crate's version"
arch=$(dpkg --print-architecture)
name=libnginx-mod-http-rate-limit
conf=mod-http-rate-limit.conf
link=50-mod-http-rate-limit.conf

root=target/debian/$name
rm -rf "$root"
install -d "$root/DEBIAN" "$root/usr/lib/nginx/modules" "$root/usr/share/nginx/modules-available" \
    "$root/usr/bin" "$root/usr/share/doc/$name" "$root/usr/share/lua/5.1/resty"
install -m 644 "$module" "$root/usr/lib/nginx/modules/ngx_http_rate_limit_module.so"
strip --strip-unneeded "$root/usr/lib/nginx/modules/ngx_http_rate_limit_module.so"
install -m 755 "$replay" "$root/usr/bin/ratelimit-replay"
strip "$root/usr/bin/ratelimit-replay"
install -m 644 lib/resty/rate_limit.lua "$root/usr/share/lua/5.1/resty/rate_limit.lua"
echo "load_module modules/ngx_http_rate_limit_module.so;" \
    >"$root/usr/share/nginx/modules-available/$conf"
chmod 644 "$root/usr/share/nginx/modules-available/$conf"
cat >"$root/usr/share/doc/$name/copyright" <<EOF
ngx-rate-limit: rate limiting for NGINX.
License: Apache-2.0 (/usr/share/common-licenses/Apache-2.0)
EOF
chmod 644 "$root/usr/share/doc/$name/copyright"

cat >"$root/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: ngx-rate-limit maintainers <ngx-rate-limit@localhost>
Section: httpd
Priority: optional
Depends: $abi, libc6
Suggests: libnginx-mod-stream
Description: rate limiting for nginx (rate_limit_zone, rate_limit)
 Leaky bucket, token bucket, sliding log and sliding window limits in shared
 memory, in limit_req's language, with RateLimit headers, Retry-After and a
 JSON admin API. Built for $nginx_package $(dpkg-query -W -f='${Version}' "$nginx_package").
 Includes ratelimit-replay, which replays an access log through a limit.
 The same module limits TCP connections and UDP sessions in the stream block
 when Debian's stream module is loaded too (libnginx-mod-stream).
EOF

# The maintainer scripts do what dh_nginx writes for Debian's module packages: enable on a
# fresh install (or a reinstall after remove), keep an admin's disabling, park the link as
# `.removed` on remove (nginx only includes *.conf), drop it on purge, ask nginx to reload.
cat >"$root/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
enabled=/etc/nginx/modules-enabled/$link
removed_link=false
if [ -L "\$enabled.removed" ]; then
    rm "\$enabled.removed"
    removed_link=true
fi
if [ -z "\$2" ] || [ "\$removed_link" = true ]; then
    mkdir -p /etc/nginx/modules-enabled
    ln -sf /usr/share/nginx/modules-available/$conf "\$enabled"
fi
if [ "\$1" = configure ] && command -v dpkg-trigger >/dev/null 2>&1; then
    dpkg-trigger --no-await nginx-reload
fi
EOF
cat >"$root/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
enabled=/etc/nginx/modules-enabled/$link
if [ "\$1" = remove ] || [ "\$1" = deconfigure ]; then
    if [ -L "\$enabled" ]; then
        mv "\$enabled" "\$enabled.removed"
    fi
fi
EOF
cat >"$root/DEBIAN/postrm" <<EOF
#!/bin/sh
set -e
enabled=/etc/nginx/modules-enabled/$link
if [ "\$1" = purge ]; then
    rm -f "\$enabled" "\$enabled.removed"
fi
if [ "\$1" = remove ] && command -v dpkg-trigger >/dev/null 2>&1; then
    dpkg-trigger --no-await nginx-reload
fi
EOF
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

deb=$PWD/target/debian/${name}_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >&2
echo "package-deb: $deb ($abi)" >&2
echo "$deb"
