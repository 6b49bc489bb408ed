#!/usr/bin/env python3
"""What a reservation at the door does to a token budget (issue 38, docs/usage.md).

50 concurrent clients on one API key for DURATION s (20), each request asking for
`max_tokens` 200-600 and using 30-100% of it, with a 100-token prompt (a body of about 400
bytes: bytes/4 is the module's prompt estimate); the budget is 3,000 tokens plus 500 a second
(a token bucket, burst=3000 rate=500r/s). A streaming fake OpenAI upstream in this process
reports the usage only when the request asks for it (`stream_options.include_usage`), as
OpenAI's API does, and counts the tokens of every request it serves: those are the tokens
admitted. Rows, one after the other in one run, each on its own zone:

- reserve=auto (the request's max_tokens plus its prompt's estimate), clients asking for usage;
- reserve=100 and reserve=400 (fixed guesses);
- reserve=1 (charging after the fact, the gateways' way);
- reserve=auto again with clients that leave include_usage out (the module asks for it).

Usage: flock /tmp/bench.lock python3 bench/usage/reserve.py NGINX MODULE OUT.md
"""
import http.server
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

from run import Server, free_port  # bench/usage/run.py

DURATION = float(os.environ.get("DURATION", "20"))
CLIENTS = 50
CAPACITY, RATE = 3000, 500
PROMPT = 100
CHUNKS, CHUNK_DELAY = 10, 0.02


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = {}
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        completion = int(body.get("x_use", 0))
        asked = (body.get("stream_options") or {}).get("include_usage") is True
        row = self.path.split("/")[1]
        with Upstream.lock:
            Upstream.served[row] = Upstream.served.get(row, 0) + PROMPT + completion
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(data):
            payload = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()

        text = "x" * 4 * completion
        for i in range(CHUNKS):
            time.sleep(CHUNK_DELAY)
            part = text[i * len(text) // CHUNKS:(i + 1) * len(text) // CHUNKS]
            event('{"object":"chat.completion.chunk","choices":[{"index":0,"delta":'
                  '{"content":"%s"}}],"usage":null}' % part)
        if asked:
            event('{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,'
                  '"completion_tokens":%d,"total_tokens":%d}}'
                  % (PROMPT, completion, PROMPT + completion))
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


ROWS = [
    ("auto", "reserve=auto", True),
    ("r100", "reserve=100", True),
    ("r400", "reserve=400", True),
    ("r1", "reserve=1", True),
    ("auto_left_out", "reserve=auto", False),
]

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
    upstream llm {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    {zones}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        {locations}
    }}
}}
"""


def request(port, row, key, body):
    head = (f"POST /{row}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def run_row(port, row, asks_usage):
    stop = time.monotonic() + DURATION
    counts = {"passed": 0, "refused": 0}
    lock = threading.Lock()

    def client(seed):
        rng = random.Random(seed)
        while time.monotonic() < stop:
            max_tokens = rng.randint(200, 600)
            use = round(max_tokens * rng.uniform(0.3, 1.0))
            body = {"model": "m", "max_tokens": max_tokens, "stream": True, "x_use": use,
                    "messages": [{"role": "user", "content": "p" * (4 * PROMPT - 120)}]}
            if asks_usage:
                body["stream_options"] = {"include_usage": True}
            status = request(port, row, "Bearer one-key", json.dumps(body).encode())
            with lock:
                counts["passed" if status == 200 else "refused"] += 1
            if status != 200:
                time.sleep(0.01)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def main():
    nginx, module, out = sys.argv[1:4]
    upstream = Server(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    zones = "\n    ".join(
        f"rate_limit_zone $http_authorization zone={row}:1m rate={RATE}r/s burst={CAPACITY} "
        "algorithm=token_bucket;" for row, _, _ in ROWS)
    locations = "\n        ".join(
        f"location /{row}/ {{ rate_limit zone={row} usage=openai {reserve}; "
        f"proxy_pass http://llm/{row}/; proxy_http_version 1.1; "
        'proxy_set_header Connection ""; proxy_buffering off; }' for row, reserve, _ in ROWS)
    with tempfile.TemporaryDirectory() as prefix:
        os.makedirs(f"{prefix}/logs")
        os.makedirs(f"{prefix}/tmp")
        open(f"{prefix}/nginx.conf", "w").write(CONF.format(
            module=module, prefix=prefix, upstream=upstream.server_address[1], port=port,
            zones=zones, locations=locations))
        subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf"], check=True)
        time.sleep(0.5)
        try:
            results = []
            for row, reserve, asks in ROWS:
                counts = run_row(port, row, asks)
                results.append((row, reserve, asks, counts))
                time.sleep(1)
        finally:
            subprocess.run([nginx, "-p", prefix, "-c", f"{prefix}/nginx.conf", "-s", "stop"])
    budget = CAPACITY + RATE * DURATION
    lines = [
        "# Usage bench: what the reservation does to a token budget (bench/usage/reserve.py)",
        "",
        f"nginx {nginx}, module {module}; {CLIENTS} concurrent clients on one key, "
        f"{DURATION:.0f} s a row, requests of max_tokens 200-600 using 30-100% of it plus a "
        f"{PROMPT}-token prompt, streamed in {CHUNKS} chunks {CHUNK_DELAY * 1000:.0f} ms apart; "
        f"budget {CAPACITY:,} + {RATE} tokens/s = {budget:,.0f} tokens. Admitted: the tokens "
        "the upstream served (prompt + completion of every request it answered).",
        "",
        "| row | clients ask for usage | requests admitted | refused | tokens admitted | "
        "admitted / budget |",
        "|---|---|---|---|---|---|",
    ]
    for row, reserve, asks, counts in results:
        tokens = Upstream.served.get(row, 0)
        lines.append(f"| `{reserve}` | {'yes' if asks else 'no (left out)'} | "
                     f"{counts['passed']} | {counts['refused']} | {tokens:,} | "
                     f"{tokens / budget:.2f} |")
    text = "\n".join(lines) + "\n"
    open(out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
