#!/usr/bin/env bash
# Runs docs/install.md's shell blocks for an installed nginx as the page gives them, in its
# order, as root on this machine (CI runs it after installing Debian's nginx):
#   "Debian and Ubuntu": the package built and installed; the page's zone line put in
#     /etc/nginx/conf.d/rate-limit.conf and its rate_limit line in the default site's
#     `location /`; nginx started (as the page says of a container) and the reload block run;
#     the 40-request curl block prints 21 to 25 `200`s (1 at the rate, 20 of burst, plus what
#     the rate refills while curl runs) and `429` for the rest, and a 429 has Retry-After;
#     then the rate_limit lines removed and `apt-get remove` leaves a config that passes.
#   "Any installed nginx": both build-for-nginx.sh lines, which print the page's load_module
#     line; then the integration suite against Debian's nginx with that module (the page's
#     TEST_NGINX_BINARY block: CI's Debian pass).
# /etc/nginx is restored, the nginx it started stopped and the package purged on exit,
# whatever happened. Port 80 must be free (the page's curl asks the default site).
#
#   scripts/check-install.sh
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "check-install: FAILED: $*" >&2
    exit 1
}
say() { echo "check-install: $*" >&2; }

page=docs/install.md
[ "$(id -u)" -eq 0 ] || die "run as root (the page's commands install into /etc/nginx)"
command -v nginx >/dev/null || die "no nginx on PATH: apt-get install nginx"
package=libnginx-mod-http-rate-limit
dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q '^install ok installed' &&
    die "$package is already installed: this check installs and purges it, remove it first"
! (exec 3<>/dev/tcp/127.0.0.1/80) 2>/dev/null || die "port 80 is in use: the page's curl asks it"

scratch=$(mktemp -d)
# The fenced blocks in language $2 of the section "## $1", each to $scratch/$3.N; prints N.
extract() {
    awk -v heading="## $1" -v fence="\`\`\`$2" -v out="$scratch/$3" '
        $0 == heading { inside = 1; next }
        inside && /^## / { inside = 0 }
        inside && !open && $0 == fence { open = 1; count++; next }
        inside && open && $0 == "```" { open = 0; next }
        inside && open { print > (out "." count) }
        END { print count + 0 }
    ' "$page"
}
debian="Debian and Ubuntu: a package for the installed nginx"
any='Any installed nginx: `scripts/build-for-nginx.sh`'
[ "$(extract "$debian" sh debian)" = 3 ] || die "$page: \"$debian\" no longer has 3 shell blocks: update this script"
[ "$(extract "$debian" nginx line)" = 2 ] || die "$page: \"$debian\" no longer has 2 nginx lines: update this script"
[ "$(extract "$any" sh any)" = 2 ] || die "$page: \"$any\" no longer has 2 shell blocks: update this script"

tar -C /etc -cpf "$scratch/etc-nginx.tar" nginx
restored=
restore() {
    [ -z "$restored" ] || return 0
    if [ -f /run/nginx.pid ]; then
        local pid
        pid=$(cat /run/nginx.pid)
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    env DEBIAN_FRONTEND=noninteractive apt-get -y -q purge "$package" >/dev/null 2>&1 || true
    rm -rf /etc/nginx
    tar -C /etc -xpf "$scratch/etc-nginx.tar"
    restored=1
    say "/etc/nginx restored, $package purged"
}
trap 'status=$?; restore; rm -rf "$scratch"; exit $status' EXIT

# A block of the page, run by bash as written; its output to $scratch/NAME.out and stderr.
run_block() {
    say "running $page's block:"
    sed 's/^/    /' "$scratch/$1" >&2
    bash -e "$scratch/$1" | tee "$scratch/$1.out" || die "the block above failed"
}

run_block debian.1
site=/etc/nginx/sites-enabled/default
grep -q '^[[:space:]]*location / {' "$site" || die "$site has no 'location / {' line"
cp "$scratch/line.1" /etc/nginx/conf.d/rate-limit.conf
sed -i "/^[[:space:]]*location \/ {/r $scratch/line.2" "$site"
say "the page's lines: /etc/nginx/conf.d/rate-limit.conf and $site's location /"
nginx || die "nginx did not start"
run_block debian.2
# The reload's new workers have the same config as the first ones: any of them may answer.
run_block debian.3
read -r -a statuses <"$scratch/debian.3.out"
passed=$(printf '%s\n' "${statuses[@]}" | grep -cx 200 || true)
refused=$(printf '%s\n' "${statuses[@]}" | grep -cx 429 || true)
say "40 requests: $passed × 200, $refused × 429 (the page: about 21 × 200, then 429)"
[ "${#statuses[@]}" = 40 ] || die "curl printed ${#statuses[@]} statuses, not 40"
[ "$((passed + refused))" = 40 ] || die "statuses other than 200 and 429: ${statuses[*]}"
[ "$passed" -ge 21 ] && [ "$passed" -le 25 ] || die "$passed × 200, not 21 to 25: ${statuses[*]}"
for index in $(seq 0 20); do
    [ "${statuses[$index]}" = 200 ] || die "request $((index + 1)) of the first 21 was refused: ${statuses[*]}"
done
curl -s -o /dev/null -D "$scratch/headers" 'http://127.0.0.1/?41'
grep -qi '^HTTP/1.1 429' "$scratch/headers" || die "the 41st request was not refused: $(cat "$scratch/headers")"
grep -qi '^Retry-After: [1-9]' "$scratch/headers" || die "a 429 without Retry-After: $(cat "$scratch/headers")"
say "a 429 carries $(grep -i '^Retry-After' "$scratch/headers" | tr -d '\r')"
nginx -s quit
for _ in $(seq 50); do [ -f /run/nginx.pid ] || break; sleep 0.1; done
[ ! -f /run/nginx.pid ] || die "nginx did not quit"
# As the page says: the rate_limit lines go first, then the package.
rm /etc/nginx/conf.d/rate-limit.conf
cp "$site" "$scratch/site" && grep -vxFf "$scratch/line.2" "$scratch/site" >"$site"
env DEBIAN_FRONTEND=noninteractive apt-get -y -q remove "$package" >/dev/null ||
    die "apt-get remove $package"
nginx -t -q || die "nginx -t after apt-get remove"
say "apt-get remove $package: nginx -t passes"
restore

run_block any.1
shown=$(grep -o '^load_module /path/to/ngx-rate-limit/target/nginx-[^ ]*;$' "$page") ||
    die "$page shows no load_module line for build-for-nginx.sh's module"
expected=${shown/\/path\/to\/ngx-rate-limit/$PWD}
[ "$(grep -cxF "$expected" "$scratch/any.1.out")" = 2 ] ||
    die "both lines should print $expected; they printed: $(grep load_module "$scratch/any.1.out")"
say "both build-for-nginx.sh lines print the page's $shown (with this checkout's path)"
run_block any.2
say "OK: every shell block of $page's \"$debian\" and \"$any\" ran as written"
