"""Target 1: instructions added per request, counted by callgrind.

nginx runs as a single process (`master_process off`) under `valgrind --tool=callgrind`, one
run per (location, key pattern), each run with the same config and the same requests over
one keep-alive connection, lock-step. Startup, config parsing, zone setup and shutdown are
identical in every run, so

    instructions per request = (Ir of the run - Ir of the unlimited run) / requests.

The limited locations use a rate so high and a burst so large that nothing is rejected or
delayed: what is measured is the cost of the lookup and the decision.
"""

import os
import re
import subprocess

from .client import KeepAliveClient
from .nginx import Nginx, server_per_limiter

# Zones hold every distinct key without evicting (native needs ~128 bytes per key).
#
# Each location has a server of its own, on a port of its own, and the same URI: nginx's
# work to parse the request line and find the location is then the same for every limiter.
# (With several locations in one server, a longer name costs about 19 instructions per byte
# to parse, and the position of its node in the location tree tens more, all of which would
# be charged to the limiter.)
HTTP_BODY = """
    limit_req_zone  $arg_k zone=native:16m rate=1000000r/s;
    rate_limit_zone $arg_k zone=ours:16m   rate=1000000r/s;

""" + server_per_limiter({
    "none": [],
    "native": ["limit_req zone=native burst=1000000 nodelay;"],
    "ours": ["rate_limit zone=ours burst=1000000 nodelay;", "rate_limit_headers off;"],
    "ours_headers": ["rate_limit zone=ours burst=1000000 nodelay;"],
})

LOCATIONS = ["none", "native", "ours", "ours_headers"]
PATTERNS = ["distinct", "hot"]


def request_paths(pattern, requests):
    if pattern == "distinct":
        return [f"/t?k={i:08d}" for i in range(requests)]
    return ["/t?k=00000001"] * requests


def total_ir(callgrind_out):
    with open(callgrind_out) as f:
        for line in f:
            match = re.match(r"(?:summary|totals):\s+(\d+)", line)
            if match:
                return int(match.group(1))
    raise RuntimeError(f"no totals in {callgrind_out}")


def run_one(binaries, directory, location, pattern, requests):
    name = f"{pattern}-{location}"
    out = os.path.join(directory, f"callgrind.{name}.out")
    wrapper = ["valgrind", "--tool=callgrind", "--dump-instr=no",
               f"--callgrind-out-file={out}", f"--log-file={directory}/valgrind.{name}.log"]
    statuses = {}
    with Nginx(binaries, os.path.join(directory, f"prefix-{name}"), HTTP_BODY,
               master=False, wrapper=wrapper, port_names=LOCATIONS[1:]) as nginx:
        port = nginx.port_of(location)
        with KeepAliveClient(port, timeout=600) as client:
            for path in request_paths(pattern, requests):
                status = client.get(path)
                statuses[status] = statuses.get(status, 0) + 1
            reconnects = client.reconnects
    if statuses != {200: requests} or reconnects:
        raise RuntimeError(f"{name}: expected {requests} x 200 on one connection, got "
                           f"{statuses}, {reconnects} reconnects")
    return total_ir(out), out


def module_costs(callgrind_out, module_name, requests, top=12):
    """Top self costs (Ir per request) of functions in the module's object, plus its total."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", callgrind_out],
        capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)", line)
        if not match or module_name not in line:
            continue
        ir = int(match.group(1).replace(",", ""))
        function = match.group(2)
        function = re.sub(r"\s*\[[^\]]*\]\s*$", "", function)
        function = function.split(":", 1)[-1] if function.startswith("???:") else function
        rows.append((ir / requests, function))
    rows.sort(reverse=True)
    return sum(ir for ir, _ in rows), rows[:top]


def run(binaries, directory, requests, locations=LOCATIONS, log=print):
    """{pattern: {location: Ir per request over `none`}}, raw totals, and the out files."""
    os.makedirs(directory, exist_ok=True)
    totals = {}
    outs = {}
    for pattern in PATTERNS:
        for location in locations:
            log(f"  callgrind: {pattern:8} /{location} ({requests} requests)")
            totals[(pattern, location)], outs[(pattern, location)] = run_one(
                binaries, directory, location, pattern, requests)
    per_request = {
        pattern: {
            location: (totals[(pattern, location)] - totals[(pattern, "none")]) / requests
            for location in locations if location != "none"
        }
        for pattern in PATTERNS
    }
    return per_request, totals, outs


def inclusive_cost(callgrind_out, function, requests):
    """Inclusive Ir per request of the first function whose name contains `function`."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", callgrind_out],
        capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)", line)
        if match and function in match.group(2):
            return int(match.group(1).replace(",", "")) / requests
    return float("nan")


def callee_costs(callgrind_out, function, requests, top=10):
    """What `function` spends per request, itself and in each function it calls (inclusive),
    as callgrind's calling tree lists them: [(Ir per request, name, calls per request)]."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--tree=calling", "--threshold=100",
         callgrind_out], capture_output=True, text=True, check=True).stdout
    rows = []
    inside = False
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+([*>])\s+(.*)", line)
        if not match:
            inside = False if not line.strip() else inside
            continue
        ir = int(match.group(1).replace(",", ""))
        marker, name = match.group(2), match.group(3)
        if marker == "*":
            inside = function in name
            if inside:
                rows.append((ir / requests, "(total, inclusive) " + _short(name), 1.0))
            continue
        if inside:
            calls = re.search(r"\(([\d,]+)x\)", name)
            count = int(calls.group(1).replace(",", "")) / requests if calls else float("nan")
            rows.append((ir / requests, _short(re.sub(r"\s*\([\d,]+x\)", "", name)), count))
    return rows[:top + 1]


def _short(name):
    """`file.c:function [object]` or `???:function [object]` -> `function`."""
    name = re.sub(r"\s*\[[^\]]*\]\s*$", "", name)
    return re.sub(r"^(?:\?\?\?|\S*\.(?:c|h|S|rs)):", "", name)
