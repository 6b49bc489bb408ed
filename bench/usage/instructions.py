#!/usr/bin/env python3
"""The usage reader's cost in instructions (docs/usage.md, issue 29's "at most 5%"): nginx
proxying the same streamed completions through a location without the module and through
one with `usage=openai` (the reader and its limit), counted by callgrind.

CPU seconds on a shared 2-core machine move by more than the 5% to be measured (the CPU part
of run.py saw rounds 10% apart); callgrind counts instructions, the same for the same work
whatever else the machine does. nginx runs as one process (`master_process off`) under
valgrind, one run per location and stream count, all with the same config; a run with one
stream measures startup, shutdown and the first stream's one-off work, so

    instructions per stream = (Ir of the run with N + 1 streams - Ir of the run with one) / N.

(Every run serves a stream before nginx is told to quit: a signal that came before nginx set
its handlers, which under valgrind is a long while after it listens, would be lost.)

The upstream (run.py's, in this process) writes each of a stream's 42 events on its own,
DELAY_MS apart, so that nginx reads them one at a time under valgrind too: the reader then
sees the chunking a real stream has, and both locations do the same reads.

Usage: python3 bench/usage/instructions.py NGINX MODULE [STREAMS]
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the fake upstream and the client)

DELAY_MS = int(os.environ.get("DELAY_MS", "5"))
CHUNKS = 40

CONF = """
load_module {module};
master_process off;
daemon off;
worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    rate_limit_zone $http_authorization zone=tpm:1m rate=100000r/s burst=1000000
                    algorithm=token_bucket;
    upstream llm {{ server 127.0.0.1:{upstream}; keepalive 8; }}
    server {{
        listen 127.0.0.1:{port};
        location /plain/ {{
            proxy_pass http://llm/; proxy_http_version 1.1; proxy_set_header Connection "";
            proxy_buffering off; }}
        location /reader/ {{ rate_limit zone=tpm usage=openai reserve=1;
            proxy_pass http://llm/; proxy_http_version 1.1; proxy_set_header Connection "";
            proxy_buffering off; }}
    }}
}}
"""


def wait_port(port, process, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited with {process.returncode} before listening")
        try:
            with run.socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nginx did not listen on {port} within {seconds} s")


def total_ir(path):
    with open(path) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def run_once(nginx, module, upstream_port, location, streams, directory):
    prefix = tempfile.mkdtemp(prefix=f"usage-ir-{location}-{streams}-", dir=directory)
    os.makedirs(f"{prefix}/tmp")
    os.makedirs(f"{prefix}/logs")
    port = run.free_port()
    open(f"{prefix}/nginx.conf", "w").write(CONF.format(
        module=module, prefix=prefix, port=port, upstream=upstream_port))
    out = f"{prefix}/callgrind.out"
    process = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}",
         f"--log-file={prefix}/valgrind.log", nginx, "-p", prefix, "-c",
         f"{prefix}/nginx.conf"])
    try:
        wait_port(port, process)
        for i in range(streams):
            status, _, data = run.request(
                port, f"/{location}/v1/chat/completions?completion=200&chunks={CHUNKS}"
                      f"&delay_ms={DELAY_MS}", f"Bearer ir-{i % 10}")
            if status != 200 or b"[DONE]" not in data:
                raise RuntimeError(f"/{location}/: stream {i} answered {status}")
    finally:
        subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf", "-s", "quit"],
                       check=False, capture_output=True)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    return total_ir(out)


def main():
    nginx, module = sys.argv[1:3]
    streams = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    upstream = run.Server(("127.0.0.1", 0), run.Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    directory = tempfile.mkdtemp(prefix="usage-ir-")
    per_stream = {}
    for location in ("plain", "reader"):
        idle = run_once(nginx, module, upstream.server_port, location, 1, directory)
        busy = run_once(nginx, module, upstream.server_port, location, streams + 1, directory)
        per_stream[location] = (busy - idle) / streams
        print(f"{location}: {per_stream[location]:.0f} instructions per stream "
              f"({streams} streams of {CHUNKS} chunks)", flush=True)
    added = per_stream["reader"] / per_stream["plain"] - 1
    print(f"the reader and its limit add {added * 100:+.1f}% of nginx's instructions "
          f"({per_stream['reader'] - per_stream['plain']:.0f} per stream, "
          f"{(per_stream['reader'] - per_stream['plain']) / (CHUNKS + 2):.0f} per event)")


if __name__ == "__main__":
    main()
