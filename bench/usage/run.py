#!/usr/bin/env python3
"""Usage-based limits bench (docs/usage.md): Debian's nginx with the module built for it
(scripts/build-for-nginx.sh, release), a streaming fake OpenAI upstream in this process.

1. tokens: 50 concurrent clients on one API key for DURATION s, each streaming completions of
   300-500 tokens (prompt 20): tokens admitted against the budget K + r*W, with `usage=openai
   reserve=100` and with a per-request limit tuned to the same budget at an average of 225
   tokens a request (what a gateway that charges per request gives).
2. latency: time to first byte and the p99 gap between chunks of 20-chunk streams (20 ms apart
   at the upstream), through the reader and through a location without it.
3. cpu: nginx's worker CPU time for the same fast streams with and without the reader.

4. with --sync: part 1 on two instances sharing the zone through a redis-server started here
   (`rate_limit_sync`, `sync` zone), the 50 clients alternating between them; the results are
   appended to OUT.md as a section of their own.

Usage: flock /tmp/bench.lock python3 bench/usage/run.py NGINX MODULE OUT.md
       flock /tmp/bench.lock python3 bench/usage/run.py --sync NGINX MODULE OUT.md
"""
import http.server
import os
import random
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

DURATION = float(os.environ.get("DURATION", "30"))
LATENCY_STREAMS = int(os.environ.get("LATENCY_STREAMS", "100"))
CPU_STREAMS = int(os.environ.get("CPU_STREAMS", "2000"))


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        number = lambda name, default: int(query.get(name, [default])[0])
        prompt, completion = number("prompt", 20), number("completion", 100)
        chunks, delay = number("chunks", 10), number("delay_ms", 0) / 1000
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(data):
            payload = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()

        for i in range(chunks):
            if delay:
                time.sleep(delay)
            event('{"object":"chat.completion.chunk","choices":[{"index":0,"delta":'
                  '{"content":"token %d of a completion, a few words long"}}],"usage":null}' % i)
        total = prompt + completion
        event('{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,'
              '"completion_tokens":%d,"total_tokens":%d}}' % (prompt, completion, total))
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 512


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What every location does: proxy to the fake upstream on a kept-alive connection, passing
# each chunk on as it comes.
PROXY = ('proxy_pass http://llm/; proxy_http_version 1.1; proxy_set_header Connection ""; '
         'proxy_buffering off;')

CONF = """
load_module {module};
worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    rate_limit_zone $http_authorization zone=tpm:1m rate={rate}r/s burst={capacity}
                    algorithm=token_bucket;
    rate_limit_zone $http_authorization zone=rpm:1m rate={request_rate}r/s
                    burst={request_burst} algorithm=token_bucket;
    upstream llm {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location /usage/ {{ rate_limit zone=tpm usage=openai reserve=100;
            {proxy} }}
        location /usage400/ {{ rate_limit zone=tpm usage=openai reserve=400;
            {proxy} }}
        location /per_request/ {{ rate_limit zone=rpm;
            {proxy} }}
        location /plain/ {{
            {proxy} }}
        location /reader/ {{ rate_limit zone=tpm usage=openai reserve=1;
            {proxy} }}
    }}
}}
"""


def request(port, path, key):
    """POST path; returns (status, [(time, bytes)] of each read, from the send)."""
    body = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.perf_counter()
        s.sendall(head + body)
        reads, data = [], b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reads.append((time.perf_counter() - start, len(chunk)))
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, reads, data


def tokens_run(port, path, seconds, key):
    """50 clients on one key: the tokens of every completion let through. `port` may be a
    list: client i sends to port i modulo its length."""
    ports = port if isinstance(port, list) else [port]
    admitted, refused, lock = [0, 0], [0], threading.Lock()
    stop = time.time() + seconds

    def client(seed):
        rng = random.Random(seed)
        while time.time() < stop:
            completion = rng.randint(280, 480)
            status, _, _ = request(ports[seed % len(ports)],
                                   f"{path}v1/chat/completions?prompt=20&completion="
                                   f"{completion}&chunks=10&delay_ms=20", key)
            with lock:
                if status == 200:
                    admitted[0] += 20 + completion
                    admitted[1] += 1
                else:
                    refused[0] += 1
            if status != 200:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return admitted[0], admitted[1], refused[0]


def latency_run(port, path, count):
    ttfb, gaps = [], []
    for i in range(count):
        _, reads, _ = request(port, f"{path}v1/chat/completions?completion=50&chunks=20"
                              "&delay_ms=20", f"Bearer lat-{i}")
        ttfb.append(reads[0][0] * 1000)
        gaps += [(b[0] - a[0]) * 1000 for a, b in zip(reads, reads[1:])]
    gaps.sort()
    return statistics.median(ttfb), gaps[int(len(gaps) * 0.99) - 1]


def worker_cpu(prefix):
    master = int(open(f"{prefix}/nginx.pid").read())
    children = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True)
    total = 0
    for pid in children.stdout.split():
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def cpu_run(port, prefix, path, count, concurrency=8):
    before = worker_cpu(prefix)
    started = time.time()
    per = count // concurrency

    def client(c):
        for i in range(per):
            request(port, f"{path}v1/chat/completions?completion=200&chunks=40",
                    f"Bearer cpu-{c}-{i % 50}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return worker_cpu(prefix) - before, time.time() - started


SYNC_CONF = """
load_module {module};
worker_processes 1;
error_log {prefix}/error.log notice;
pid {prefix}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    rate_limit_sync redis://127.0.0.1:{redis} interval=100ms;
    rate_limit_zone $http_authorization zone=tpm:1m rate={rate}r/s burst={capacity}
                    algorithm=token_bucket sync;
    upstream llm {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location /usage/ {{ rate_limit zone=tpm usage=openai reserve=100;
            {proxy} }}
        location /usage400/ {{ rate_limit zone=tpm usage=openai reserve=400;
            {proxy} }}
    }}
}}
"""


def sync_main(nginx, module, out):
    """Part 1 on two instances sharing one `sync` zone through Redis."""
    upstream = Server(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    rate, capacity = 500, 3000
    prefixes, ports = [], []
    for _ in range(2):
        prefix = tempfile.mkdtemp(prefix="usage-sync-bench-")
        os.makedirs(f"{prefix}/tmp")
        os.makedirs(f"{prefix}/logs")  # nginx opens its built-in error log before the conf
        port = free_port()
        open(f"{prefix}/nginx.conf", "w").write(SYNC_CONF.format(
            module=module, prefix=prefix, port=port, upstream=upstream.server_port,
            redis=redis_port, rate=rate, capacity=capacity, proxy=PROXY))
        prefixes.append(prefix)
        ports.append(port)
    lines = []
    try:
        time.sleep(0.5)
        for prefix in prefixes:
            subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf"], check=True)
        time.sleep(1.5)  # both heartbeats seen: each instance counts 2
        budget = capacity + rate * DURATION
        for name, path in [("usage=openai reserve=100", "/usage/"),
                           ("usage=openai reserve=400", "/usage400/")]:
            print(f"sync tokens {name}", file=sys.stderr, flush=True)
            tokens, ok, refused = tokens_run(ports, path, DURATION,
                                             f"Bearer sync-{path.strip('/')}")
            lines.append(f"| {name} | {ok} | {refused} | {tokens} | {budget:.0f} | "
                         f"{tokens / budget:.3f} |")
        logs = "".join(open(f"{p}/error.log").read() for p in prefixes)
        synced = logs.count("synced with Redis")
    finally:
        for prefix in prefixes:
            subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf", "-s", "stop"])
        redis.terminate()
        redis.wait()
    section = f"""
## Two instances, one `sync` zone: 50 clients on one key, {DURATION:.0f} s

`python3 bench/usage/run.py --sync NGINX MODULE OUT.md` (nginx {nginx}, module {module}):
the same budget ({capacity} + {rate} x {DURATION:.0f} = {budget:.0f} tokens) in a `sync` zone
shared by two instances of one worker through a redis-server started by the bench
(`interval=100ms`; "synced with Redis" logged {synced} times, once per instance when
it first synced), the 50 clients alternating between the instances (25 on each).

| limit | completions let through | refused | tokens admitted | budget | admitted / budget |
|---|---|---|---|---|---|
""" + "\n".join(lines) + """

The bound across instances (docs/usage.md, "Sync zones") is what the fleet's doors admit
(the fleet's bucket and drain, plus the grants handed out ahead: each instance starts a key
with half the bucket) plus C x the largest overrun, C now the key's requests in flight on both
instances together: at most 30 with reservations of 100 (the doors' 3000 / 100), at most 7
with 400. Below 1 is the strict side: a stream lasts about 200 ms, two sync intervals, so
most reservations are sent to Redis before they settle, and the fleet keeps counting a
reservation above the usage (400 reserved, 300 used: 400 counted).
"""
    with open(out, "a") as f:
        f.write(section)
    print(section)


def main():
    if sys.argv[1] == "--sync":
        sync_main(*sys.argv[2:5])
        return
    nginx, module, out = sys.argv[1:4]
    upstream = Server(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    prefix = tempfile.mkdtemp(prefix="usage-bench-")
    os.makedirs(f"{prefix}/tmp")
    port = free_port()
    rate, capacity = 500, 3000
    average = 225
    conf = CONF.format(module=module, prefix=prefix, port=port, upstream=upstream.server_port,
                       rate=rate, capacity=capacity, request_rate=round(rate / average, 3),
                       request_burst=capacity // average, proxy=PROXY)
    open(f"{prefix}/nginx.conf", "w").write(conf)
    subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf"], check=True)
    time.sleep(0.5)
    lines = []
    try:
        budget = capacity + rate * DURATION
        for name, path in [("usage=openai reserve=100", "/usage/"),
                           ("usage=openai reserve=400", "/usage400/"),
                           (f"per request ({rate / average:.3f}r/s burst "
                            f"{capacity // average})", "/per_request/")]:
            print(f"tokens {name}", file=sys.stderr, flush=True)
            # Each run has a key of its own, whose bucket starts full.
            tokens, ok, refused = tokens_run(port, path, DURATION, f"Bearer {path.strip('/')}")
            lines.append(f"| {name} | {ok} | {refused} | {tokens} | {budget:.0f} | "
                         f"{tokens / budget:.3f} |")
        latency = {}
        for name, path in [("without the reader", "/plain/"), ("with the reader", "/reader/")]:
            print(f"latency {name}", file=sys.stderr, flush=True)
            latency[name] = latency_run(port, path, LATENCY_STREAMS)
        cpu = {}
        for _ in range(2):
            for name, path in [("without the reader", "/plain/"), ("with the reader", "/reader/")]:
                print(f"cpu {name}", file=sys.stderr, flush=True)
                seconds, wall = cpu_run(port, prefix, path, CPU_STREAMS)
                cpu.setdefault(name, []).append((seconds, wall))
    finally:
        subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf", "-s", "stop"])
    with open(out, "w") as f:
        f.write(f"""# Usage-based limits bench (bench/usage/run.py)

Debian's nginx ({nginx}) with the module built for it by scripts/build-for-nginx.sh
(release), one worker; the fake upstream is a Python thread server in the bench's process.
The machine (2 cores) was shared with other helpers building and testing: read the figures as
indicative.

## Tokens admitted: 50 concurrent clients on one key, {DURATION:.0f} s

Budget: a token bucket of {capacity} tokens refilled at {rate} tokens/s, so
{capacity} + {rate} x {DURATION:.0f} = {budget:.0f} tokens in the run. Completions of 300-500
tokens (prompt 20, 280-480 completion), streamed in 10 chunks 20 ms apart. The per-request
limit is tuned to the same budget for an average of {average} tokens a request.
A refused client waits 50 ms and tries again.

| limit | completions let through | refused | tokens admitted | budget | admitted / budget |
|---|---|---|---|---|---|
""" + "\n".join(lines) + f"""

The stated bound is budget + C x largest overrun (docs/usage.md): with reservations of 100,
overruns up to 400 and C at most {capacity} / 100 = 30 in flight, up to 12,000 more (the first
instant admits 30 requests before any has reported its usage); with reservations of 400,
overruns up to 100 and C at most 7, up to 700 more. The per-request limit has no bound in
tokens: its overshoot is whatever the key's completions average above the {average} it was
tuned for.

## Latency through the reader: {LATENCY_STREAMS} streams of 20 chunks, 20 ms apart

| | median time to first byte (ms) | p99 gap between reads (ms) |
|---|---|---|
""" + "\n".join(f"| {name} | {t:.2f} | {g:.2f} |" for name, (t, g) in latency.items()) + f"""

## nginx CPU: {CPU_STREAMS} streams of 40 chunks, 8 at a time, no delay (two rounds each)

| | worker CPU s (round 1, round 2) | wall s |
|---|---|---|
""" + "\n".join(f"| {name} | {r[0][0]:.2f}, {r[1][0]:.2f} | {r[0][1]:.1f}, {r[1][1]:.1f} |"
               for name, r in cpu.items()) + "\n")
    print(open(out).read())


if __name__ == "__main__":
    main()
