"""The adaptive limit under attack and on other upstream shapes (issue 27, point 6).

    python3 -m ratebench.adaptive_attack --nginx NGINX --module MODULE --root REPO
    (bench/adaptive-attack.sh)

1. A slow-path attacker: one shared key, legit requests of 20 ms and 20% of all requests to a
   slow path of 1-2 s (a URL that waits on something else: it holds a slot, not the upstream),
   behind a fixed `limit=100` and behind `limit=adaptive`, 40 s each (a periodic probe at 30 s).
2. Capacity C -> C/4 -> C on a FIFO worker pool and on a bimodal one (cache hits and misses),
   offered twice the capacity, 20 s per phase, behind `limit=adaptive`.

Raw outputs go to bench/results/adaptive-attack-<UTC time>/; the summary to
bench/results/adaptive-attack.md (with --write-summary). Exit status: 0 the targets were met,
1 they were not, 2 the bench could not run.
"""

import argparse
import asyncio
import datetime
import json
import os
import sys
import traceback
import urllib.request

from . import openloop
from .__main__ import machine
from .nginx import Binaries, Nginx, free_port
from .upstream import UpstreamProcess
from .protect import quantile

ADAPTIVE = "limit=adaptive min=4 max=500"
# 1. The attacker: an upstream of ample capacity (40 at once in 20 ms: 2000/s), 150 requests
# a second in all, 20% slow (about 45 slow ones in flight).
ATTACK_TOTAL_PER_S = 150
ATTACK_SLOW_SHARE = 0.2
ATTACK_S = 40
ATTACK_SETTLE_S = 5
LEGIT_TIMEOUT_S = 1.0
SLOW_TIMEOUT_S = 5.0
# 2. The shapes: C workers of b each, twice the capacity offered.
SHAPE_WORKERS = 16
SHAPE_BASE_MS = 100
SHAPE_PHASE_S = 20
SHAPE_SETTLE_S = 5
SHAPE_TIMEOUT_S = 3.0
OVERLOAD = 2.0
# Targets.
ATTACK_SHARE = 0.9
CAPACITY_SHARE = 0.9


def log(message):
    print(message, file=sys.stderr, flush=True)


def http_body(limit, upstream_port, admin_port):
    return f"""    rate_limit_zone $server_name zone=auto:1m algorithm=concurrency {limit};
    upstream app {{
        server 127.0.0.1:{upstream_port};
    }}
    server {{
        listen 127.0.0.1:{{port}};
        server_name bench;
        location / {{
            rate_limit zone=auto;
            proxy_pass http://app;
            proxy_read_timeout 300s;
        }}
    }}
    server {{
        listen 127.0.0.1:{admin_port};
        location /api/ {{ rate_limit_admin; }}
    }}
"""


def admin_key(port):
    """The zone's busiest key's adaptive state (limit, phase, latencies), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/zones/auto",
                                    timeout=1) as answer:
            zone = json.loads(answer.read())
    except (OSError, ValueError):
        return None
    adaptive = zone.get("adaptive")
    if not adaptive:
        return None
    return dict(adaptive, in_flight=zone.get("in_flight"))


async def mixed_load(port, rate_per_s, slow_share, duration_s, seed, events=()):
    """Open-loop Poisson arrivals; each is slow (`/slow/`) with probability `slow_share`.
    Returns (start time, [(is_slow, Result)])."""
    def pick(rng):
        slow = rng.random() < slow_share
        return ("/slow/x", SLOW_TIMEOUT_S, True) if slow else ("/work", LEGIT_TIMEOUT_S, False)
    return await openloop.run_mixed(port, rate_per_s, duration_s, seed, pick, events)


def watcher(admin_port, duration_s, samples):
    async def watch():
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        while loop.time() < end:
            sample = await asyncio.to_thread(admin_key, admin_port)
            samples.append((loop.time(), sample))
            await asyncio.sleep(0.25)
    return watch


def per_second(started, tagged, total_s, timeout_s, legit_only):
    good = [0] * (total_s + 2)
    refused = [0] * (total_s + 2)
    for slow, r in tagged:
        if legit_only and slow:
            continue
        second = int(r.end - started)
        if second >= len(good):
            continue
        if r.status == 200 and r.latency <= timeout_s:
            good[second] += 1
        elif r.status in (429, 503):
            refused[second] += 1
    return good[:total_s], refused[:total_s]


def run_attack(binaries, root, directory, column, limit, seed):
    os.makedirs(directory, exist_ok=True)
    upstream = UpstreamProcess(root, directory, 40, 20, shape="ps")
    admin_port = free_port()
    samples = []
    try:
        with Nginx(binaries, os.path.join(directory, "nginx"),
                   http_body(limit, upstream.port, admin_port), workers=2) as nginx:
            started, tagged = asyncio.run(mixed_load(
                nginx.port, ATTACK_TOTAL_PER_S, ATTACK_SLOW_SHARE, ATTACK_S, seed,
                [(0, watcher(admin_port, ATTACK_S, samples))]))
    finally:
        upstream.stop()
    good, refused = per_second(started, tagged, ATTACK_S, LEGIT_TIMEOUT_S, legit_only=True)
    measured = good[ATTACK_SETTLE_S:]
    worst5 = min(sum(measured[i:i + 5]) / 5 for i in range(len(measured) - 4))
    states = [(round(at - started, 2), s) for at, s in samples if s]
    no_load = [s.get("no_load_latency_ms") or 0 for at, s in states if at >= ATTACK_SETTLE_S]
    legit = [r for slow, r in tagged if not slow and r.status == 200]
    return {
        "column": column,
        "limit": limit,
        "legit_goodput": sum(measured) / len(measured),
        "legit_worst_5s": worst5,
        "legit_refused": sum(refused[ATTACK_SETTLE_S:]),
        "legit_p99_ms": 1000 * quantile([r.latency for r in legit
                                          if r.end - started >= ATTACK_SETTLE_S], 0.99),
        "no_load_ms_max": max(no_load) if no_load else None,
        "no_load_ms_min": min(no_load) if no_load else None,
        "requests": len(tagged),
        "per_second": good,
        "refused_per_second": refused,
        "states": states,
    }


def run_shape(binaries, root, directory, shape, seed):
    os.makedirs(directory, exist_ok=True)
    upstream = UpstreamProcess(root, directory, SHAPE_WORKERS, SHAPE_BASE_MS, shape=shape)
    admin_port = free_port()
    samples = []
    total_s = 3 * SHAPE_PHASE_S
    capacity = SHAPE_WORKERS * 1000 / SHAPE_BASE_MS
    try:
        with Nginx(binaries, os.path.join(directory, "nginx"),
                   http_body(ADAPTIVE, upstream.port, admin_port), workers=2) as nginx:
            def set_capacity(workers):
                async def change():
                    await asyncio.to_thread(upstream.get, f"/_capacity/{workers:g}")
                return change
            events = [(0, watcher(admin_port, total_s, samples)),
                      (SHAPE_PHASE_S, set_capacity(SHAPE_WORKERS / 4)),
                      (2 * SHAPE_PHASE_S, set_capacity(SHAPE_WORKERS))]
            started, tagged = asyncio.run(mixed_load(
                nginx.port, OVERLOAD * capacity, 0.0, total_s, seed, events))
    finally:
        upstream.stop()
    good, _ = per_second(started, tagged, total_s, SHAPE_TIMEOUT_S, legit_only=False)
    phases = []
    for index, share in enumerate((1.0, 0.25, 1.0)):
        first = index * SHAPE_PHASE_S + SHAPE_SETTLE_S
        last = (index + 1) * SHAPE_PHASE_S
        mean = sum(good[first:last]) / (last - first)
        phases.append({"capacity": capacity * share, "goodput": mean})
    states = [(round(at - started, 2), s) for at, s in samples if s]
    return {"shape": shape, "phases": phases, "per_second": good, "states": states,
            "requests": len(tagged)}


def checks(attack, shapes):
    out = []
    fixed = next(a for a in attack if a["column"] == "fixed")
    adaptive = next(a for a in attack if a["column"] == "adaptive")
    share = adaptive["legit_goodput"] / max(fixed["legit_goodput"], 1e-9)
    out.append(("legit goodput with a 20% slow-path attacker, adaptive / fixed limit=100",
                share >= ATTACK_SHARE, f"{share:.2f} ≥ {ATTACK_SHARE}"))
    for s in shapes:
        for name, phase in zip(("C", "C/4", "back at C"), s["phases"]):
            ratio = phase["goodput"] / phase["capacity"]
            out.append((f"{s['shape']} goodput {name}", ratio >= CAPACITY_SHARE,
                        f"{phase['goodput']:.0f}/s of {phase['capacity']:.0f}/s = {ratio:.2f} "
                        f"≥ {CAPACITY_SHARE}"))
    return out


def state_rows(states, every_s=1.0):
    rows = []
    shown = -every_s
    for at, s in states:
        if at - shown < every_s:
            continue
        shown = at
        rows.append(f"| {at:.1f} | {s.get('in_flight', '-')} | {s.get('limit', '-')} | "
                    f"{s.get('phase', '-')} | {s.get('latency_ms', '-')} | "
                    f"{s.get('no_load_latency_ms', '-')} |")
    return rows


def render(attack, shapes, info):
    capacity = SHAPE_WORKERS * 1000 / SHAPE_BASE_MS
    lines = [
        "# The adaptive limit under attack and on other upstreams (bench/adaptive-attack.sh)",
        "",
        "Issue 27, point 6. nginx with 2 workers, the synthetic upstream of "
        "`bench/ratebench/upstream.py` on loopback, open-loop Poisson clients (one connection "
        "per request), all on the same shared 2-core machine (other builds and tests ran "
        "beside it: see Machine).",
        "",
        f"## 1. A slow-path attacker",
        "",
        f"One shared key (`$server_name`). The upstream shares 40 workers of 20 ms (2000/s: "
        f"never the bottleneck). {ATTACK_TOTAL_PER_S} requests/s, {ATTACK_SLOW_SHARE:.0%} of "
        f"them to `/slow/`, which takes 1-2 s without using the upstream (about "
        f"{ATTACK_TOTAL_PER_S * ATTACK_SLOW_SHARE * 1.5:.0f} in flight). Legit goodput: legit "
        f"answers `200` within {LEGIT_TIMEOUT_S:g} s per second, from {ATTACK_SETTLE_S} s to "
        f"{ATTACK_S} s (a periodic probe runs 30 s after the key's first). No-load latency: "
        f"what the admin API showed after {ATTACK_SETTLE_S} s (real: about 21 ms).",
        "",
        "| limiter | legit goodput /s | worst 5 s /s | legit refused | legit p99 ms | "
        "no-load ms (min-max) | requests |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a in attack:
        no_load = ("-" if a["no_load_ms_max"] is None
                   else f"{a['no_load_ms_min']:.1f}-{a['no_load_ms_max']:.1f}")
        lines.append(f"| `{a['limit']}` | {a['legit_goodput']:.1f} | {a['legit_worst_5s']:.1f} | "
                     f"{a['legit_refused']} | {a['legit_p99_ms']:.0f} | {no_load} | "
                     f"{a['requests']} |")
    lines += [
        "",
        f"## 2. Capacity C → C/4 → C on a FIFO pool and on a bimodal one",
        "",
        f"C = {SHAPE_WORKERS} workers of b = {SHAPE_BASE_MS} ms with a FIFO backlog "
        f"({capacity:.0f}/s); bimodal: the same pool, 70% of the requests take b/4 and 30% "
        f"2.75 b (cache hits and misses, mean b). {OVERLOAD:g}× the capacity offered, "
        f"`{ADAPTIVE}`; after {SHAPE_PHASE_S} s the pool drops to C/4, after "
        f"{2 * SHAPE_PHASE_S} s it is back at C. Goodput: answers `200` within "
        f"{SHAPE_TIMEOUT_S:g} s per second, from {SHAPE_SETTLE_S} s into each phase.",
        "",
        "| upstream | goodput C | goodput C/4 | goodput back at C | requests |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in shapes:
        cells = [f"{p['goodput']:.0f}/s ({p['goodput'] / p['capacity']:.0%})" for p in s["phases"]]
        lines.append(f"| {s['shape']} | " + " | ".join(cells) + f" | {s['requests']} |")
    lines += ["", "## Targets", ""]
    for name, ok, text in checks(attack, shapes):
        lines.append(f"- {name}: {text} — {'met' if ok else 'NOT met'}")
    lines += ["", "## Per second", "",
              "Legit goodput per second with the attacker (by the second requests ended):", "",
              "| second | " + " | ".join(a["column"] for a in attack) + " |",
              "| --- | " + " | ".join("---" for _ in attack) + " |"]
    for second in range(ATTACK_S):
        lines.append(f"| {second} | " + " | ".join(str(a["per_second"][second]) for a in attack)
                     + " |")
    lines += ["", "Goodput per second on the shapes (C/4 from second "
              f"{SHAPE_PHASE_S}, C again from {2 * SHAPE_PHASE_S}):", "",
              "| second | " + " | ".join(s["shape"] for s in shapes) + " |",
              "| --- | " + " | ".join("---" for _ in shapes) + " |"]
    for second in range(3 * SHAPE_PHASE_S):
        lines.append(f"| {second} | " + " | ".join(str(s["per_second"][second]) for s in shapes)
                     + " |")
    for title, states in ([(f"The shared key under attack (`{a['limit']}`)", a["states"])
                           for a in attack if a["column"] == "adaptive"]
                          + [(f"The key on the {s['shape']} upstream", s["states"])
                             for s in shapes]):
        lines += ["", f"{title}, through the admin API, about one sample a second:", "",
                  "| second | in flight | limit | phase | median ms | no-load ms |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += state_rows(states)
    lines += ["", "## Machine", ""]
    lines += [f"- {key.replace('_', ' ')}: {value}" for key, value in info.items()]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(prog="ratebench.adaptive_attack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nginx", required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--root", required=True, help="repository root")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--write-summary", action="store_true",
                        help="write bench/results/adaptive-attack.md")
    args = parser.parse_args()
    args.root = os.path.abspath(args.root)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_dir = os.path.join(args.root, "bench", "results")
    run_dir = os.path.join(results_dir, f"adaptive-attack-{stamp}")
    os.makedirs(run_dir)
    binaries = Binaries.snapshot(args.nginx, args.module, os.path.join(run_dir, "bin"))
    info = machine(args.root, binaries)
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    log(f"ratebench adaptive_attack: raw outputs in {run_dir}")
    try:
        attack = []
        for column, limit in (("fixed", "limit=100"), ("adaptive", ADAPTIVE)):
            log(f"attack, {limit}: {ATTACK_S} s")
            attack.append(run_attack(binaries, args.root, os.path.join(run_dir, column),
                                     column, limit, args.seed))
        shapes = []
        for shape in ("fifo", "bimodal"):
            log(f"shape {shape}: {3 * SHAPE_PHASE_S} s")
            shapes.append(run_shape(binaries, args.root, os.path.join(run_dir, shape), shape,
                                    args.seed))
    except Exception:
        traceback.print_exc()
        log(f"ratebench adaptive_attack: the bench could not finish; outputs in {run_dir}")
        return 2
    info["load_average_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    summary = render(attack, shapes, info)
    print(summary)
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump({"attack": attack, "shapes": shapes}, f, indent=2, default=str)
    with open(os.path.join(run_dir, "summary.md"), "w") as f:
        f.write(summary)
    if args.write_summary:
        with open(os.path.join(results_dir, "adaptive-attack.md"), "w") as f:
            f.write(summary)
    return 0 if all(ok for _, ok, _ in checks(attack, shapes)) else 1


if __name__ == "__main__":
    sys.exit(main())
