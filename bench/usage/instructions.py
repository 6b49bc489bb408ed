#!/usr/bin/env python3
"""The usage reader's cost (docs/usage.md, issue 29's "at most 5%"): nginx proxying the same
streamed completions through a location without the module (`plain`), through one with a
per-request limit on the same zone (`limit`) and through one with `usage=openai` (`reader`:
the reader and its limit), counted by callgrind, then the same nginx's CPU time natively.

CPU seconds on a shared 2-core machine move by more than the 5% to be measured (the CPU part
of run.py saw rounds 10% apart); callgrind counts instructions, the same for the same work
whatever else the machine does. nginx runs as one process (`master_process off`) under
valgrind (bench/ratebench's `Nginx`, as target 1 runs it), one run per location and stream
count, all with the same config; a run with one stream measures startup, shutdown and the
first stream's one-off work (the upstream connection, the zone's first key), so

    instructions per stream = (Ir of the run with N + 1 streams - Ir of the run with one) / N.

The upstream (run.py's, in this process) writes each of a stream's 42 events on its own,
DELAY_MS apart (DELAY_MS=0: all at once), so that nginx reads them one at a time under
valgrind too: the reader then sees the chunking a real stream has, and every location does
the same reads.

The CPU pass runs nginx natively, the locations taking turns for CPU_ROUNDS rounds of
CPU_STREAMS streams, and reads the process's CPU time: the user share (/proc/PID/stat, in
clock ticks, over all of a location's rounds) and the median round's total
(/proc/PID/schedstat, in nanoseconds). The reader's instructions are user-space work: their
share of nginx's instructions times the user share is their share of nginx's CPU, a figure
the direct CPU rounds are too noisy to give.

Usage: python3 bench/usage/instructions.py NGINX MODULE [STREAMS]
"""
import os
import statistics
import sys
import tempfile
import threading

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.dirname(here))
import run  # noqa: E402  (the fake upstream, the client, the locations' proxying)
from ratebench.instructions import total_ir  # noqa: E402
from ratebench.nginx import Binaries, Nginx  # noqa: E402

DELAY_MS = int(os.environ.get("DELAY_MS", "5"))
CHUNKS = 40
# The CPU pass: rounds of streams, CONCURRENCY at a time, the locations taking turns.
CPU_ROUNDS = int(os.environ.get("CPU_ROUNDS", "5"))
CPU_STREAMS = int(os.environ.get("CPU_STREAMS", "160"))
CONCURRENCY = 8

# Inside `http { }` (ratebench's render_config); `{port}` is the server's port.
HTTP_BODY = """
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    rate_limit_zone $http_authorization zone=tpm:1m rate=100000r/s burst=1000000
                    algorithm=token_bucket;
    upstream llm { server 127.0.0.1:{upstream}; keepalive 8; }
    server {
        listen 127.0.0.1:{port};
        location /plain/ { {proxy} }
        location /limit/ { rate_limit zone=tpm; {proxy} }
        location /reader/ { rate_limit zone=tpm usage=openai reserve=1; {proxy} }
    }
"""
# No module line; the same zone charged 1 a request (what a per-request limit costs); the
# reader and its usage-based limit.
LOCATIONS = ("plain", "limit", "reader")


def http_body(prefix, upstream_port):
    return (HTTP_BODY.replace("{prefix}", prefix).replace("{upstream}", str(upstream_port))
            .replace("{proxy}", run.PROXY))


def stream(port, location, i):
    status, _, data = run.request(
        port, f"/{location}/v1/chat/completions?completion=200&chunks={CHUNKS}"
              f"&delay_ms={DELAY_MS}", f"Bearer ir-{i % 10}")
    if status != 200 or b"[DONE]" not in data:
        raise RuntimeError(f"/{location}/: stream {i} answered {status}")


def run_once(binaries, upstream_port, location, streams, directory):
    prefix = tempfile.mkdtemp(prefix=f"{location}-{streams}-", dir=directory)
    os.makedirs(f"{prefix}/tmp")
    out = f"{prefix}/callgrind.out"
    wrapper = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}",
               f"--log-file={prefix}/valgrind.log"]
    with Nginx(binaries, prefix, http_body(prefix, upstream_port), master=False,
               wrapper=wrapper) as nginx:
        for i in range(streams):
            stream(nginx.port, location, i)
    return total_ir(out)


def cpu_pass(binaries, upstream_port, directory):
    """nginx natively (one process), the locations taking turns for CPU_ROUNDS rounds of
    CPU_STREAMS streams: per location, the user share of all its rounds' CPU and the median
    round's CPU seconds."""
    prefix = tempfile.mkdtemp(prefix="cpu-", dir=directory)
    os.makedirs(f"{prefix}/tmp")
    rounds = {location: [] for location in LOCATIONS}
    with Nginx(binaries, prefix, http_body(prefix, upstream_port), master=False) as nginx:
        for _ in range(CPU_ROUNDS):
            for location in LOCATIONS:
                before = nginx.workers_cpu()
                threads = [threading.Thread(target=lambda c=c: [
                    stream(nginx.port, location, i)
                    for i in range(c, CPU_STREAMS, CONCURRENCY)]) for c in range(CONCURRENCY)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                after = nginx.workers_cpu()
                rounds[location].append(tuple(a - b for a, b in zip(after, before)))
    return {location: (sum(u for u, _, _ in r) / sum(u + s for u, s, _ in r),
                       statistics.median(total for _, _, total in r))
            for location, r in rounds.items()}


def main():
    binaries = Binaries(*sys.argv[1:3])
    streams = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    upstream = run.Server(("127.0.0.1", 0), run.Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    directory = tempfile.mkdtemp(prefix="usage-ir-")
    per_stream = {}
    for location in LOCATIONS:
        idle = run_once(binaries, upstream.server_port, location, 1, directory)
        busy = run_once(binaries, upstream.server_port, location, streams + 1, directory)
        per_stream[location] = (busy - idle) / streams
        print(f"{location}: {per_stream[location]:.0f} instructions per stream "
              f"({streams} streams of {CHUNKS} chunks)", flush=True)
    plain = per_stream["plain"]
    for name, location, base in [("the reader and its limit", "reader", "plain"),
                                 ("the reader alone (over a per-request limit)", "reader",
                                  "limit"),
                                 ("a per-request limit", "limit", "plain")]:
        added = per_stream[location] - per_stream[base]
        print(f"{name}: {added:+.0f} instructions per stream ({added / plain * 100:+.1f}% of "
              f"nginx's {plain:.0f}; {added / (CHUNKS + 2):.0f} per event)")
    if CPU_ROUNDS == 0:
        return
    cpu = cpu_pass(binaries, upstream.server_port, directory)
    print(f"CPU, median of {CPU_ROUNDS} rounds of {CPU_STREAMS} streams ({CONCURRENCY} at a "
          f"time), nginx natively:")
    for location, (user_share, total) in cpu.items():
        print(f"  {location}: {total:.3f} s (user {user_share * 100:.0f}%)")
    user_share = cpu["plain"][0]
    for name, location, base in [("the reader and its limit", "reader", "plain"),
                                 ("the reader alone", "reader", "limit")]:
        added = (per_stream[location] - per_stream[base]) / plain
        measured = cpu[location][1] / cpu[base][1] - 1
        print(f"{name}: {added * user_share * 100:+.1f}% of nginx's CPU from its instructions "
              f"(x the user share {user_share:.2f}); {measured * 100:+.1f}% measured")


if __name__ == "__main__":
    main()
