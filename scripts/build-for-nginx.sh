#!/usr/bin/env bash
# Builds the rate limit module for an nginx that is already installed, checks that this nginx
# loads it, and prints the load_module line.
#
#   scripts/build-for-nginx.sh [NGINX_BINARY]     NGINX_BINARY defaults to the nginx on PATH
#
# A module must be built against the exact nginx version (and configure options) of the binary
# that loads it. The source of that version comes from, in this order:
#   1. NGINX_SOURCE_DIR, when set (an unpacked nginx source tree of the same version);
#   2. the distribution's source package, when the binary belongs to a Debian/Ubuntu package
#      (`apt-get source`, with deb-src entries derived from the system's apt sources in a
#      private apt state under target/, so the machine's apt configuration is not touched);
#   3. the source vendored by the nginx-src crate, when its version matches;
# else the script stops and says which tarball to get.
#
# The source is copied to target/nginx-<version>/src and configured (configure only, no make)
# with the binary's own `nginx -V` arguments plus --with-compat, into target/nginx-<version>/objs.
# The module is built in target/nginx-<version>/release/ (cargo's target dir for this nginx,
# apart from the development build in target/debug) and copied to
# target/nginx-<version>/ngx_http_rate_limit_module.so, the module's name wherever it is
# loaded. Progress goes to stderr; stdout gets only the load_module line.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "build-for-nginx: $*" >&2
    exit 1
}
say() { echo "build-for-nginx: $*" >&2; }

binary=${1:-$(command -v nginx || true)}
[ -n "$binary" ] || die "no nginx on PATH: give the nginx binary as the first argument"
[ -e "$binary" ] || die "$binary does not exist: give the path of the nginx you run (\`command -v nginx\`, or \`ps -o args= -C nginx\` for a running one; Debian's is /usr/sbin/nginx)"
binary=$(readlink -f "$binary")
[ -f "$binary" ] && [ -x "$binary" ] || die "$binary is not an executable file"

info=$("$binary" -V 2>&1) || die "\"$binary -V\" failed: $info"
# "nginx version: nginx/1.22.1", or "openresty/1.21.4.1", "nginx/1.25.3 (Ubuntu)".
product=$(sed -n 's|^nginx version: \([^/ ]*\)/.*|\1|p' <<<"$info")
version=$(sed -n 's|^nginx version: [^/ ]*/\([0-9][0-9.]*\).*|\1|p' <<<"$info")
[ -n "$version" ] || die "cannot read the version in \"$binary -V\": $info"
if [ "$product" = openresty ]; then
    # OpenResty 1.21.4.1 bundles nginx 1.21.4: the module is built against that core.
    openresty_version=$version
    version=$(cut -d. -f1-3 <<<"$version")
fi
arguments=$(sed -n 's/^configure arguments: //p' <<<"$info")

out=$PWD/target/nginx-$version
mkdir -p "$out"
say "$binary is nginx $version${openresty_version:+ (OpenResty $openresty_version)}"

# The source's own version, from src/core/nginx.h.
source_version() {
    sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$1/src/core/nginx.h" 2>/dev/null
}

# Copies a source tree to $out/src (configure writes a Makefile into the tree it runs in).
take_source() {
    if [ "$(readlink -f "$1")" != "$out/src" ]; then
        rm -rf "$out/src"
        cp -a "$1" "$out/src"
    fi
}

# Fetches the Debian/Ubuntu source package of the binary's package into $out/src. Returns 1
# when the binary is not from a package or no source of its version can be downloaded.
debian_source() {
    command -v dpkg-query >/dev/null && command -v apt-get >/dev/null || return 1
    local owner package source_package source_version apt_dir
    owner=$(dpkg-query -S "$binary" 2>/dev/null | head -n1) || return 1
    package=${owner%%:*}
    source_package=$(dpkg-query -W -f='${source:Package}' "$package") || return 1
    source_version=$(dpkg-query -W -f='${source:Version}' "$package") || return 1
    say "$binary belongs to the package $package (source package $source_package $source_version)"
    command -v dpkg-source >/dev/null || die "apt-get source needs dpkg-source: apt-get install dpkg-dev"

    # deb-src twins of the system's deb entries, in a private apt state: nothing under /etc/apt
    # or /var/lib/apt changes.
    apt_dir=$PWD/target/apt-source
    mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    rm -f "$apt_dir/sources.list.d/"*
    local file
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$file" \
            >>"$apt_dir/sources.list.d/deb-src.list"
    done
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        sed 's/^Types:.*/Types: deb-src/' "$file" >"$apt_dir/sources.list.d/$(basename "$file")"
    done
    local apt=(-q -o "Dir::Etc::SourceList=/dev/null"
        -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
        -o "APT::Sandbox::User=$(id -un)")
    say "reading the deb-src indexes (private apt state in $apt_dir)"
    apt-get "${apt[@]}" update >"$out/apt-update.log" 2>&1 ||
        { say "apt-get update failed: $(tail -n3 "$out/apt-update.log")"; return 1; }

    # The exact version first. The security pocket's index may list a version whose .dsc is no
    # longer served (404): then any other version of the same upstream release serves, since
    # the headers a module compiles against are upstream's.
    local upstream=${source_version#*:}
    upstream=${upstream%-*}
    local candidates
    candidates=$(apt-cache "${apt[@]}" showsrc --only-source "$source_package" 2>/dev/null |
        sed -n 's/^Version: //p' | sort -u | sort -rV |
        awk -v exact="$source_version" -v upstream="$upstream" '
            { v = $0; sub(/^[0-9]+:/, "", v); sub(/-[^-]*$/, "", v) }
            $0 == exact { print; next }
            v == upstream { rest = rest $0 "\n" }
            END { printf "%s", rest }')
    [ -n "$candidates" ] || { say "no source of $source_package $upstream in the deb-src indexes"; return 1; }
    local candidate remaining
    remaining=$(wc -w <<<"$candidates")
    for candidate in $candidates; do
        remaining=$((remaining - 1))
        say "apt-get source $source_package=$candidate"
        rm -rf "$out/debian-source"
        mkdir -p "$out/debian-source"
        if (cd "$out/debian-source" &&
            apt-get "${apt[@]}" source --only-source "$source_package=$candidate") \
            >"$out/apt-source.log" 2>&1; then
            local tree
            tree=$(find "$out/debian-source" -mindepth 4 -maxdepth 4 -path '*/src/core/nginx.h' |
                head -n1)
            tree=${tree%/src/core/nginx.h}
            if [ -n "$tree" ] && [ "$(source_version "$tree")" = "$version" ]; then
                rm -rf "$out/src"
                mv "$tree" "$out/src"
                echo "$source_package $candidate" >"$out/src/.source-package"
                return 0
            fi
            say "$source_package $candidate does not hold nginx $version"
        else
            local why
            why=$(grep -m1 '^E:' "$out/apt-source.log" || tail -n1 "$out/apt-source.log")
            if [ "$remaining" -gt 0 ]; then
                # Expected on Debian: the index can list a security update whose files the
                # mirror no longer serves. Not an error while another candidate remains.
                say "$source_package $candidate is listed but not served (${why#E: }); trying another $upstream package, whose nginx headers are the same"
            else
                say "apt-get source $source_package=$candidate failed: $why"
            fi
        fi
    done
    return 1
}

# 1-3: find the source.
if [ -n "${NGINX_SOURCE_DIR:-}" ]; then
    found=$(source_version "$NGINX_SOURCE_DIR")
    [ -n "$found" ] || die "NGINX_SOURCE_DIR=$NGINX_SOURCE_DIR is not an nginx source tree (no src/core/nginx.h)"
    [ "$found" = "$version" ] ||
        die "NGINX_SOURCE_DIR=$NGINX_SOURCE_DIR holds nginx $found, but $binary is nginx $version"
    say "source: NGINX_SOURCE_DIR=$NGINX_SOURCE_DIR"
    take_source "$NGINX_SOURCE_DIR"
elif [ "$(source_version "$out/src")" = "$version" ] && [ -f "$out/src/.source-package" ]; then
    say "source: $out/src (from $(cat "$out/src/.source-package"), fetched before)"
elif debian_source; then
    say "source: $out/src (from $(cat "$out/src/.source-package"))"
else
    vendored=$(cargo metadata --format-version 1 2>/dev/null |
        grep -o '"manifest_path":"[^"]*/nginx-src-[^"]*/Cargo.toml"' | head -n1 |
        sed 's/"manifest_path":"\(.*\)\/Cargo.toml"/\1/')
    if [ -n "$vendored" ] && [ "$(source_version "$vendored/nginx")" = "$version" ]; then
        say "source: the vendored nginx-src crate ($vendored/nginx)"
        take_source "$vendored/nginx"
    elif [ "$product" = openresty ]; then
        die "no source of OpenResty $openresty_version found. Get
    https://openresty.org/download/openresty-$openresty_version.tar.gz
unpack it, and run again with its nginx tree:
    NGINX_SOURCE_DIR=/path/to/openresty-$openresty_version/bundle/nginx-$version $0 $binary"
    else
        die "no source of nginx $version found (no distribution source package of it could be \
fetched, and the vendored source is ${vendored:+nginx $(source_version "$vendored/nginx")}). Get
    https://nginx.org/download/nginx-$version.tar.gz
unpack it, and run again with:
    NGINX_SOURCE_DIR=/path/to/nginx-$version $0 $binary"
    fi
fi

# Configure with the binary's own arguments (parsed with xargs, which honours the quotes of
# `nginx -V` without evaluating anything) plus --with-compat. Dynamic and third-party modules
# are left out: they are separate objects that the module's ABI does not depend on, and their
# libraries or sources are usually not here. --builddir is ours.
readarray -d '' given < <(printf '%s' "$arguments" | xargs printf '%s\0')
configure_args=()
for argument in "${given[@]}"; do
    case $argument in
    "" | *=dynamic | --add-dynamic-module=* | --add-module=* | --builddir=* | --with-compat) ;;
    *) configure_args+=("$argument") ;;
    esac
done
configure_args+=(--with-compat "--builddir=$out/objs")
printf '%s\n' "${configure_args[@]}" >"$out/configure-args.new"
if [ -f "$out/objs/ngx_auto_config.h" ] && cmp -s "$out/configure-args.new" "$out/configure-args"; then
    say "configured before with the same arguments: $out/objs"
else
    say "configuring nginx $version ($out/configure.log)"
    configure=./configure
    [ -x "$out/src/configure" ] || configure=auto/configure
    if ! (cd "$out/src" && "$configure" "${configure_args[@]}") >"$out/configure.log" 2>&1; then
        tail -n 5 "$out/configure.log" >&2
        die "configure failed ($out/configure.log): install the development package of the \
library it names (Debian: libpcre2-dev libssl-dev zlib1g-dev)"
    fi
    mv "$out/configure-args.new" "$out/configure-args"
fi
rm -f "$out/configure-args.new"
# The stream part of the module (src/stream/) needs the stream headers for its bindings. A
# binary with a dynamic stream module (Debian's --with-stream=dynamic, dropped from the
# arguments above like every dynamic module) gets them added to the includes nginx-sys reads:
# the module names no stream symbol, and finds them in the loaded stream module at run time.
if grep -q -- '--with-stream' <<<"$arguments" && ! grep -q '^	-I src/stream ' "$out/objs/Makefile"; then
    sed -i 's|^ALL_INCS = -I src/core \\$|ALL_INCS = -I src/core \\\n\t-I src/stream \\|' "$out/objs/Makefile"
    grep -q '^	-I src/stream ' "$out/objs/Makefile" || die "cannot add the stream headers to $out/objs/Makefile"
fi

say "building the module (cargo build --release --no-default-features --features export-modules)"
NGINX_SOURCE_DIR=$out/src NGINX_BUILD_DIR=$out/objs CARGO_TARGET_DIR=$out \
    cargo build --release --no-default-features --features export-modules -p ngx-rate-limit >&2
# cargo names the library libngx_http_rate_limit_module.so; the module's name, the one the
# Debian package installs and every load_module line uses, has no "lib".
built=$out/release/libngx_http_rate_limit_module.so
[ -f "$built" ] || die "cargo did not produce $built"
module=$out/ngx_http_rate_limit_module.so
install -m 644 "$built" "$module"

# The check: that very binary loads the module and accepts a zone and a limit.
check=$out/check
rm -rf "$check"
mkdir -p "$check/logs"
cat >"$check/nginx.conf" <<EOF
load_module $module;
pid $check/logs/nginx.pid;
error_log $check/logs/error.log;
events {}
http {
    client_body_temp_path $check/client_body;
    proxy_temp_path $check/proxy;
    fastcgi_temp_path $check/fastcgi;
    uwsgi_temp_path $check/uwsgi;
    scgi_temp_path $check/scgi;
    access_log off;
    rate_limit_zone \$binary_remote_addr zone=check:1m rate=10r/s;
    server {
        listen 127.0.0.1:8080;
        location / {
            rate_limit zone=check burst=5;
        }
    }
}
EOF
if ! result=$("$binary" -t -p "$check" -c "$check/nginx.conf" -e "$check/logs/error.log" 2>&1); then
    echo "$result" >&2
    die "$binary refuses the module (config: $check/nginx.conf)"
fi
say "$binary -t accepts a config that loads the module and limits"

echo "load_module $module;"
