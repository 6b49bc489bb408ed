"""rate_limit against native limit_req, side by side in one nginx binary (issue 5).

    python3 -m ratebench full  --nginx NGINX --module MODULE --root REPO   (bench/run.sh)
    python3 -m ratebench check --nginx NGINX --module MODULE --root REPO   (bench/check.sh)

Raw outputs go to bench/results/<mode>-<UTC time>/; `full` also writes bench/results/latest.md.
Exit status: 0 all targets met, 1 some target failed, 2 the bench itself could not run.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback

from . import accuracy, criterion, instructions, memory, report, throughput
from .nginx import Binaries

MODULE_OBJECT = "libngx_http_rate_limit_module"

# Sizes of each mode: full is the reference bench (about 17 minutes on 2 cores), check the
# fast subset that fails when a ratio of targets 1-3 falls short.
MODES = {
    "full": {
        "callgrind_requests": 20_000,
        "callgrind_locations": instructions.LOCATIONS,
        "memory_keys": 100_000,
        "accuracy_s": 10,
        "accuracy_warm_up_s": 2,
        "accuracy_runs": accuracy.PER_SECOND_RUNS,
        "per_minute_s": 70,
        "throughput": True,
        "criterion": True,
    },
    "check": {
        "callgrind_requests": 5_000,
        "callgrind_locations": ["none", "native", "ours"],
        "memory_keys": 100_000,
        "accuracy_s": 5,
        "accuracy_warm_up_s": 1,
        "accuracy_runs": {"5000r/s": accuracy.PER_SECOND_RUNS["5000r/s"][:2]},
        "per_minute_s": 0,
        "throughput": False,
        "criterion": False,
    },
}


def log(message):
    print(message, file=sys.stderr, flush=True)


def command_output(command, **kwargs):
    try:
        return subprocess.run(command, capture_output=True, text=True, **kwargs).stdout.strip()
    except OSError:
        return ""


def cpu_busy_percent(seconds=2.0):
    """Share of all cores busy over `seconds` (before the bench starts: other work)."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)
    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    return 100.0 * (busy1 - busy0) / max(1, total1 - total0)


def machine(root, binaries):
    model = ""
    for line in command_output(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    # nginx -v prints to stderr.
    nginx_version = subprocess.run([binaries.nginx, "-v"], capture_output=True,
                                   text=True).stderr.strip()
    commit = command_output(["git", "-C", root, "rev-parse", "--short", "HEAD"])
    dirty = command_output(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "nginx": nginx_version.replace("nginx version: ", ""),
        "commit": commit + (" (with uncommitted changes in the checkout)" if dirty else ""),
        "load_average_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpu_busy_before_start": f"{cpu_busy_percent():.0f}% (other work on the machine)",
    }


def cost_breakdown(outs, requests):
    """Callgrind's view of both handlers, per request, for the summary."""
    sections = []
    for pattern in instructions.PATTERNS:
        ours = outs.get((pattern, "ours"))
        native = outs.get((pattern, "native"))
        if not ours or not native:
            continue
        lines = [f"### {pattern} keys: where the instructions go (Ir per request)", ""]
        lines.append("ours, `preaccess_handler` and what it calls (inclusive):")
        lines.append("```")
        for ir, name, calls in instructions.callee_costs(ours, "::preaccess_handler", requests):
            lines.append(f"{ir:8.0f}  {name}" + (f"  ({calls:g} calls)" if calls != 1 else ""))
        for ir, name, calls in instructions.callee_costs(ours, "handler::resolve", requests)[1:]:
            lines.append(f"{ir:8.0f}    resolve -> {name}")
        lines.append("```")
        total, top = instructions.module_costs(ours, MODULE_OBJECT, requests)
        lines.append(f"ours, self cost of the module's functions ({total:.0f} in all):")
        lines.append("```")
        lines += [f"{ir:8.1f}  {name}" for ir, name in top if ir >= 0.5]
        lines.append("```")
        lines.append("native, `ngx_http_limit_req_handler` and what it calls (inclusive):")
        lines.append("```")
        for ir, name, calls in instructions.callee_costs(native, "ngx_http_limit_req_handler ",
                                                         requests):
            lines.append(f"{ir:8.0f}  {name}")
        lines.append("```")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def main():
    parser = argparse.ArgumentParser(prog="ratebench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--nginx", required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--root", required=True, help="repository root")
    parser.add_argument("--only", default="1,2,3,4,5", help="targets to run, e.g. 1,3")
    args = parser.parse_args()
    mode = MODES[args.mode]
    only = set(args.only.split(","))

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_dir = os.path.join(args.root, "bench", "results")
    run_dir = os.path.join(results_dir, f"{args.mode}-{stamp}")
    os.makedirs(run_dir)
    binaries = Binaries.snapshot(args.nginx, args.module, os.path.join(run_dir, "bin"))
    info = machine(args.root, binaries)
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    started = time.monotonic()
    log(f"ratebench {args.mode}: raw outputs in {run_dir}")

    rows = []
    raw = {"machine": info}
    breakdown = ""
    details = []
    try:
        if "1" in only:
            requests = mode["callgrind_requests"]
            log(f"target 1: instructions per request (callgrind, {requests} requests per run)")
            per_request, totals, outs = instructions.run(
                binaries, os.path.join(run_dir, "t1-callgrind"), requests,
                mode["callgrind_locations"], log)
            raw["instructions_per_request"] = per_request
            raw["callgrind_totals"] = {f"{p}/{l}": ir for (p, l), ir in totals.items()}
            rows += report.instruction_rows(per_request, requests)
            breakdown = cost_breakdown(outs, requests)
        if "2" in only:
            log(f"target 2: keys remembered per MiB ({mode['memory_keys']} keys)")
            remembered = memory.run(binaries, os.path.join(run_dir, "t2-memory"),
                                    mode["memory_keys"], log)
            raw["memory"] = {f"{l}/{k}": v for (l, k), v in remembered.items()}
            rows += report.memory_rows(remembered)
        if "3" in only:
            log("target 3: accuracy under overload")
            admitted = accuracy.run(binaries, os.path.join(run_dir, "t3-accuracy"),
                                    mode["accuracy_s"], mode["accuracy_warm_up_s"],
                                    mode["accuracy_runs"], mode["per_minute_s"], log)
            raw["accuracy"] = {f"{n}/{l}": v for (n, l), v in admitted.items()}
            rows += report.accuracy_rows(admitted)
            details.append(report.accuracy_details(admitted))
        if "4" in only and mode["throughput"]:
            log("target 4: throughput (wrk)")
            speed = throughput.run(binaries, os.path.join(run_dir, "t4-throughput"),
                                   log=log)
            raw["throughput"] = {f"{w}w/{k}/{l}": {key: v[key] for key in
                                                   ("rps", "p99_ms", "rps_min", "rps_max", "cpu_us")}
                                 for (w, k, l), v in speed.items()}
            rows += report.throughput_rows(speed)
            details.append(report.throughput_details(speed))
        if "5" in only and mode["criterion"]:
            log("target 5: criterion")
            ns = criterion.run(args.root, os.path.join(run_dir, "t5-criterion"), log)
            raw["criterion_ns"] = {f"{s}/{n}": v for (s, n), v in ns.items()}
            rows += report.criterion_rows(ns)
    except Exception:
        traceback.print_exc()
        log(f"ratebench: the bench could not finish; partial outputs in {run_dir}")
        return 2

    info["load_average_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info["minutes"] = round((time.monotonic() - started) / 60, 1)
    table = report.render_text(rows)
    failed = [row for row in rows if row.verdict == report.FAIL]
    print(table)
    print()
    print(f"{len(failed)} of {sum(r.verdict != report.INFO for r in rows)} checks failed; "
          f"raw outputs in {os.path.relpath(run_dir, args.root)}")

    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump(raw, f, indent=2, default=str)
    summary = summary_markdown(args.mode, info, rows, breakdown, details)
    with open(os.path.join(run_dir, "summary.md"), "w") as f:
        f.write(summary)
    if args.mode == "full" and only == set("12345"):
        with open(os.path.join(results_dir, "latest.md"), "w") as f:
            f.write(summary)
    return 1 if failed else 0


def summary_markdown(mode, info, rows, breakdown, details):
    machine_lines = "\n".join(f"- {key.replace('_', ' ')}: {value}" for key, value in info.items())
    return f"""# Performance: rate_limit vs native limit_req ({mode} run)

Produced by `bench/run.sh` (see bench/README.md for the method of each target). Both limiters
run in the same nginx binary with identical configs and loads; "ours/native" is the ratio of
the two (for target 5, ours/governor).

{report.render_markdown(rows)}

## Machine

{machine_lines}

{chr(10).join(details)}

## Callgrind: per-request costs

{breakdown or "(target 1 not run)"}
"""


if __name__ == "__main__":
    sys.exit(main())
