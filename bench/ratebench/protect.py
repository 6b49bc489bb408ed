"""Protect the upstream (issue 23): goodput and latency of a collapsing upstream behind
nginx, with no limiter, limit_req, a fixed concurrency limit and the adaptive one, side by
side in one run; the upstream's capacity halves mid-run.

    python3 -m ratebench.protect --nginx NGINX --module MODULE --root REPO   (bench/protect.sh)

Raw outputs go to bench/results/protect-<UTC time>/; the summary to
bench/results/protect.md (with --write-summary, as bench/protect.sh does for a whole run).
Exit status: 0 the adaptive column met its targets, 1 it did not, 2 the bench could not run.
"""

import argparse
import asyncio
import datetime
import json
import math
import os
import sys
import traceback
import urllib.request

from . import openloop
from .__main__ import machine
from .nginx import Binaries, Nginx, free_port
from .upstream import UpstreamProcess

# The upstream: CAPACITY requests at once in BASE_MS each, processor sharing beyond.
CAPACITY = 10
BASE_MS = 200
# Clients: twice the capacity, each request giving up after TIMEOUT_S.
OVERLOAD = 2.0
TIMEOUT_S = 1.0
# Seconds at the full capacity, then at half of it.
FULL_S = 20
HALF_S = 20
# Seconds left out at the start of each phase when averaging (the limiters settle).
SETTLE_S = 5
# Targets for the adaptive column.
GOODPUT_SHARE = 0.9
P99_BASES = 3
RECOVERY_S = 5
# Recovery: the first RECOVERY_WINDOW_S seconds in a row whose goodput is within
# RECOVERY_BAND of the new capacity.
RECOVERY_WINDOW_S = 3
RECOVERY_BAND = 0.1

# The columns: a name, what the location adds before proxy_pass, and the http-level zones.
# limit_req is "tuned to the capacity": the upstream's rate at full capacity, C / b, with a
# small burst passed at once so that Poisson arrivals are not refused below that rate.
RATE = CAPACITY * 1000 // BASE_MS
COLUMNS = {
    "none": ([], []),
    "limit_req": (
        ["limit_req zone=req burst=10 nodelay;"],
        [f"limit_req_zone $server_name zone=req:1m rate={RATE}r/s;"],
    ),
    "concurrency": (
        ["rate_limit zone=fixed;"],
        [f"rate_limit_zone $server_name zone=fixed:1m algorithm=concurrency limit={CAPACITY};"],
    ),
    "adaptive": (
        ["rate_limit zone=auto;"],
        ["rate_limit_zone $server_name zone=auto:1m algorithm=concurrency limit=adaptive "
         "min=4 max=500;"],
    ),
}
LABELS = {
    "none": "no limiter",
    "limit_req": f"limit_req rate={RATE}r/s burst=10 nodelay",
    "concurrency": f"concurrency limit={CAPACITY}",
    "adaptive": "concurrency limit=adaptive (min=4 max=500)",
}


def log(message):
    print(message, file=sys.stderr, flush=True)


def http_body(column, upstream_port, admin_port):
    location, zones = COLUMNS[column]
    lines = "".join(f"            {line}\n" for line in location)
    zone_lines = "".join(f"    {line}\n" for line in zones)
    admin = ""
    if column in ("concurrency", "adaptive"):
        admin = f"""    server {{
        listen 127.0.0.1:{admin_port};
        location /api/ {{ rate_limit_admin; }}
    }}
"""
    return f"""{zone_lines}    upstream app {{
        server 127.0.0.1:{upstream_port};
    }}
    server {{
        listen 127.0.0.1:{{port}};
        server_name bench;
        location / {{
{lines}            proxy_pass http://app;
            proxy_read_timeout 300s;
        }}
    }}
{admin}"""


def admin_sample(port):
    """The adaptive zone as the admin API shows it (its busiest key in `adaptive`), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/zones/auto",
                                    timeout=1) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


def run_column(binaries, root, directory, column, seed):
    os.makedirs(directory, exist_ok=True)
    upstream = UpstreamProcess(root, directory, CAPACITY, BASE_MS)
    admin_port = free_port()
    samples = []
    try:
        with Nginx(binaries, os.path.join(directory, "nginx"),
                   http_body(column, upstream.port, admin_port), workers=2) as nginx:
            async def halve():
                await asyncio.to_thread(upstream.get, f"/_capacity/{CAPACITY / 2:g}")

            async def watch():
                loop = asyncio.get_running_loop()
                end = loop.time() + FULL_S + HALF_S
                while loop.time() < end:
                    sample = await asyncio.to_thread(admin_sample, admin_port)
                    samples.append((loop.time(), sample))
                    await asyncio.sleep(0.25)

            events = [(FULL_S, halve)]
            if column == "adaptive":
                events.append((0, watch))
            rate = OVERLOAD * CAPACITY * 1000 / BASE_MS
            started, results = asyncio.run(openloop.run(
                nginx.port, "/work", rate, FULL_S + HALF_S, TIMEOUT_S, seed, events))
            alerts = nginx.error_lines("[alert]") + nginx.error_lines("[emerg]")
    finally:
        upstream.stop()
    with open(os.path.join(directory, "requests.tsv"), "w") as f:
        for r in results:
            f.write(f"{r.start - started:.4f}\t{r.end - started:.4f}\t{r.status}\n")
    return summarise(column, started, results, samples, alerts)


def quantile(values, share):
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered), max(1, math.ceil(len(ordered) * share)))
    return ordered[index - 1]


def summarise(column, started, results, samples, alerts):
    total_s = FULL_S + HALF_S
    per_second = [{"good": 0, "rejected": 0, "failed": 0, "latencies": []}
                  for _ in range(total_s + 2)]
    for r in results:
        second = int(r.end - started)
        if second >= len(per_second):
            continue
        bucket = per_second[second]
        if r.status == 200 and r.latency <= TIMEOUT_S:
            bucket["good"] += 1
        elif r.status in (429, 503):
            bucket["rejected"] += 1
        else:
            bucket["failed"] += 1
        if r.status not in (429, 503):
            # Admitted (or never answered): its latency, a timeout counting as infinite.
            bucket["latencies"].append(r.latency if r.status == 200 else math.inf)

    def phase(first, last):
        buckets = per_second[first:last]
        good = sum(b["good"] for b in buckets) / max(1, last - first)
        latencies = [x for b in buckets for x in b["latencies"]]
        return good, quantile(latencies, 0.99)

    full_goodput, full_p99 = phase(SETTLE_S, FULL_S)
    half_goodput, half_p99 = phase(FULL_S + SETTLE_S, total_s)
    half_capacity = CAPACITY / 2 * 1000 / BASE_MS
    recovery = None
    for start in range(FULL_S, total_s - RECOVERY_WINDOW_S + 1):
        window = per_second[start:start + RECOVERY_WINDOW_S]
        mean = sum(b["good"] for b in window) / RECOVERY_WINDOW_S
        if abs(mean - half_capacity) <= RECOVERY_BAND * half_capacity:
            recovery = start - FULL_S
            break
    # Latency: the first RECOVERY_WINDOW_S seconds in a row whose p99 is within P99_BASES b.
    latency_recovery = None
    bound = P99_BASES * BASE_MS / 1000
    for start in range(FULL_S, total_s - RECOVERY_WINDOW_S + 1):
        window = per_second[start:start + RECOVERY_WINDOW_S]
        if all(quantile(b["latencies"], 0.99) <= bound for b in window):
            latency_recovery = start - FULL_S
            break
    limits = []
    for at, sample in samples:
        adaptive = (sample or {}).get("adaptive")
        if adaptive:
            key = dict(adaptive, zone_in_flight=sample.get("in_flight"))
            limits.append((round(at - started, 2), key))
    return {
        "column": column,
        "requests": len(results),
        "full_goodput": full_goodput,
        "full_p99_s": full_p99,
        "half_goodput": half_goodput,
        "half_p99_s": half_p99,
        "recovery_s": recovery,
        "latency_recovery_s": latency_recovery,
        "per_second": [{"good": b["good"], "rejected": b["rejected"], "failed": b["failed"],
                        "p99_s": quantile(b["latencies"], 0.99)}
                       for b in per_second[:total_s]],
        "admin_samples": limits,
        "alerts": alerts,
    }


def fmt_ms(seconds):
    if math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "> 1000 (timeouts)"
    return f"{seconds * 1000:.0f}"


def render(summaries, info):
    capacity = CAPACITY * 1000 / BASE_MS
    half = capacity / 2
    lines = [
        "# Protect the upstream (bench/protect.sh)",
        "",
        f"A synthetic upstream on loopback (`bench/ratebench/upstream.py`) serves C = "
        f"{CAPACITY} requests at once in b = {BASE_MS} ms each and shares itself out beyond "
        f"(latency ≈ b · in flight / C), so its capacity is C / b = {capacity:.0f} requests/s; "
        f"it keeps working on requests whose client left. Open-loop clients offer "
        f"{OVERLOAD:g}× that ({OVERLOAD * capacity:.0f}/s, Poisson arrivals, one connection "
        f"each) with a {TIMEOUT_S:g} s timeout, through nginx (2 workers) with each limiter "
        f"in turn (a fresh upstream each time). After {FULL_S} s the upstream's C halves to "
        f"{CAPACITY / 2:g} (capacity {half:.0f}/s) for {HALF_S} s more.",
        "",
        f"Goodput: answers `200` within the timeout per second, averaged from {SETTLE_S} s "
        f"into each phase. p99: over admitted requests (not answered 429), a timeout counting "
        f"as infinite. Recovery: seconds from the halving to the first {RECOVERY_WINDOW_S} s "
        f"in a row whose mean goodput is within {RECOVERY_BAND:.0%} of the new capacity "
        f"(p99 back: the first {RECOVERY_WINDOW_S} s in a row whose p99 is within {P99_BASES} b). "
        f"Targets (adaptive): goodput ≥ {GOODPUT_SHARE:g} × capacity and p99 ≤ {P99_BASES} b "
        f"= {P99_BASES * BASE_MS} ms at full capacity, recovery ≤ {RECOVERY_S} s.",
        "",
        "| limiter | goodput /s (C) | p99 ms (C) | goodput /s (C/2) | p99 ms (C/2) | "
        "recovery s | p99 back s | requests |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        recovery = "never" if s["recovery_s"] is None else str(s["recovery_s"])
        latency = "never" if s["latency_recovery_s"] is None else str(s["latency_recovery_s"])
        lines.append(
            f"| {LABELS[s['column']]} | {s['full_goodput']:.0f} "
            f"({s['full_goodput'] / capacity:.0%}) | {fmt_ms(s['full_p99_s'])} | "
            f"{s['half_goodput']:.0f} ({s['half_goodput'] / half:.0%}) | "
            f"{fmt_ms(s['half_p99_s'])} | {recovery} | {latency} | {s['requests']} |")
    lines += ["", "Targets:", ""]
    for name, ok, text in checks(summaries):
        lines.append(f"- {name}: {text} — {'met' if ok else 'NOT met'}")
    lines += ["", "Goodput per second (answers 200 within the timeout, by the second they "
              "ended; the capacity halves at second " + str(FULL_S) + "):", ""]
    names = [s["column"] for s in summaries]
    lines.append("| second | " + " | ".join(names) + " |")
    lines.append("| --- | " + " | ".join("---" for _ in names) + " |")
    for second in range(FULL_S + HALF_S):
        cells = [str(s["per_second"][second]["good"]) for s in summaries]
        lines.append(f"| {second} | " + " | ".join(cells) + " |")
    adaptive = next((s for s in summaries if s["column"] == "adaptive"), None)
    if adaptive and adaptive["admin_samples"]:
        lines += ["", "The adaptive key through the admin API (`GET /api/zones/auto`, its "
                  "`adaptive` part), one sample a second:", "",
                  "| second | in flight | limit | phase | latency ms | no-load latency ms |",
                  "| --- | --- | --- | --- | --- | --- |"]
        shown = -1
        for at, key in adaptive["admin_samples"]:
            if int(at) == shown:
                continue
            shown = int(at)
            lines.append(f"| {at:.1f} | {key.get('in_flight', '-')} | {key.get('limit', '-')} | "
                         f"{key.get('phase', '-')} | {key.get('latency_ms', '-')} | "
                         f"{key.get('no_load_latency_ms', '-')} |")
    lines += ["", "## Machine", ""]
    lines += [f"- {key.replace('_', ' ')}: {value}" for key, value in info.items()]
    return "\n".join(lines) + "\n"


def checks(summaries):
    capacity = CAPACITY * 1000 / BASE_MS
    adaptive = next((s for s in summaries if s["column"] == "adaptive"), None)
    if adaptive is None:
        return []
    p99 = adaptive["full_p99_s"]
    recovery = adaptive["recovery_s"]
    return [
        ("adaptive goodput at 2× overload", adaptive["full_goodput"] >= GOODPUT_SHARE * capacity,
         f"{adaptive['full_goodput']:.0f}/s ≥ {GOODPUT_SHARE * capacity:.0f}/s"),
        ("adaptive p99 of admitted requests", p99 <= P99_BASES * BASE_MS / 1000,
         f"{fmt_ms(p99)} ms ≤ {P99_BASES * BASE_MS} ms"),
        ("adaptive back within 10% of the new capacity", recovery is not None
         and recovery <= RECOVERY_S, f"{'never' if recovery is None else recovery} s ≤ "
         f"{RECOVERY_S} s"),
    ]


def main():
    parser = argparse.ArgumentParser(prog="ratebench.protect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nginx", required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--root", required=True, help="repository root")
    parser.add_argument("--columns", default=",".join(COLUMNS),
                        help="limiters to run, e.g. none,limit_req")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--write-summary", action="store_true",
                        help="write bench/results/protect.md")
    args = parser.parse_args()
    args.root = os.path.abspath(args.root)
    columns = args.columns.split(",")
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        log(f"unknown column {unknown[0]!r}: the columns are {', '.join(COLUMNS)}")
        return 2

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_dir = os.path.join(args.root, "bench", "results")
    run_dir = os.path.join(results_dir, f"protect-{stamp}")
    os.makedirs(run_dir)
    binaries = Binaries.snapshot(args.nginx, args.module, os.path.join(run_dir, "bin"))
    info = machine(args.root, binaries)
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    log(f"ratebench protect: raw outputs in {run_dir}")
    summaries = []
    try:
        for column in columns:
            log(f"column {column}: {FULL_S + HALF_S} s")
            summaries.append(run_column(binaries, args.root, os.path.join(run_dir, column),
                                        column, args.seed))
    except Exception:
        traceback.print_exc()
        log(f"ratebench protect: the bench could not finish; partial outputs in {run_dir}")
        return 2
    info["load_average_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    summary = render(summaries, info)
    print(summary)
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump(summaries, f, indent=2, default=str)
    with open(os.path.join(run_dir, "summary.md"), "w") as f:
        f.write(summary)
    if args.write_summary:
        with open(os.path.join(results_dir, "protect.md"), "w") as f:
            f.write(summary)
    return 0 if all(ok for _, ok, _ in checks(summaries)) else 1


if __name__ == "__main__":
    sys.exit(main())
