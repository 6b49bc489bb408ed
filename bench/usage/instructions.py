#!/usr/bin/env python3
"""The usage reader's cost in instructions (docs/usage.md, issue 29's "at most 5%"): nginx
proxying the same streamed completions through a location without the module and through
one with `usage=openai` (the reader and its limit), counted by callgrind.

CPU seconds on a shared 2-core machine move by more than the 5% to be measured (the CPU part
of run.py saw rounds 10% apart); callgrind counts instructions, the same for the same work
whatever else the machine does. nginx runs as one process (`master_process off`) under
valgrind (bench/ratebench's `Nginx`, as target 1 runs it), one run per location and stream
count, all with the same config; a run with one stream measures startup, shutdown and the
first stream's one-off work (the upstream connection, the zone's first key), so

    instructions per stream = (Ir of the run with N + 1 streams - Ir of the run with one) / N.

The upstream (run.py's, in this process) writes each of a stream's 42 events on its own,
DELAY_MS apart, so that nginx reads them one at a time under valgrind too: the reader then
sees the chunking a real stream has, and both locations do the same reads.

Usage: python3 bench/usage/instructions.py NGINX MODULE [STREAMS]
"""
import os
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
        location /reader/ { rate_limit zone=tpm usage=openai reserve=1; {proxy} }
    }
"""


def run_once(binaries, upstream_port, location, streams, directory):
    prefix = tempfile.mkdtemp(prefix=f"{location}-{streams}-", dir=directory)
    os.makedirs(f"{prefix}/tmp")
    body = (HTTP_BODY.replace("{prefix}", prefix).replace("{upstream}", str(upstream_port))
            .replace("{proxy}", run.PROXY))
    out = f"{prefix}/callgrind.out"
    wrapper = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}",
               f"--log-file={prefix}/valgrind.log"]
    with Nginx(binaries, prefix, body, master=False, wrapper=wrapper) as nginx:
        for i in range(streams):
            status, _, data = run.request(
                nginx.port, f"/{location}/v1/chat/completions?completion=200&chunks={CHUNKS}"
                            f"&delay_ms={DELAY_MS}", f"Bearer ir-{i % 10}")
            if status != 200 or b"[DONE]" not in data:
                raise RuntimeError(f"/{location}/: stream {i} answered {status}")
    return total_ir(out)


def main():
    binaries = Binaries(*sys.argv[1:3])
    streams = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    upstream = run.Server(("127.0.0.1", 0), run.Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    directory = tempfile.mkdtemp(prefix="usage-ir-")
    per_stream = {}
    for location in ("plain", "reader"):
        idle = run_once(binaries, upstream.server_port, location, 1, directory)
        busy = run_once(binaries, upstream.server_port, location, streams + 1, directory)
        per_stream[location] = (busy - idle) / streams
        print(f"{location}: {per_stream[location]:.0f} instructions per stream "
              f"({streams} streams of {CHUNKS} chunks)", flush=True)
    added = per_stream["reader"] - per_stream["plain"]
    print(f"the reader and its limit add {added / per_stream['plain'] * 100:+.1f}% of nginx's "
          f"instructions ({added:.0f} per stream, {added / (CHUNKS + 2):.0f} per event)")


if __name__ == "__main__":
    main()
