"""Stream limits against HAProxy (issue 30): both admit 10 new connections a second per
client address in front of one TCP upstream. One attacker opens connections as fast as it can
from 127.0.0.2; 50 well-behaved clients (127.0.0.10-59) each open one connection a second.

Reports, for each proxy: the attacker's admitted connections per second against the limit,
the well-behaved clients' connect-to-banner latency (p50, p99) and refusals, and the proxy's
CPU time per connection it handled (admitted or refused) and per admitted connection.

    python3 -m ratebench.stream --nginx /usr/sbin/nginx --module M.so [--seconds 20]
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

LIMIT_PER_SEC = 10
CLIENTS = 50
ATTACKER = "127.0.0.2"
BANNER = b"220 bench ESMTP\r\n"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def upstream(port, stop):
    """The mail server: a banner for each connection, then close."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        try:
            conn.sendall(BANNER)
        except OSError:
            pass
        conn.close()
    listener.close()


def attempt(source, port):
    """One connection from `source`: (admitted, seconds from connect to banner)."""
    start = time.monotonic()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.settimeout(5)
    try:
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        data = sock.recv(64)
        return data.startswith(b"220"), time.monotonic() - start
    except OSError:
        return False, time.monotonic() - start
    finally:
        sock.close()


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def run_load(port, pids, seconds):
    stop = threading.Event()
    attacker = {"admitted": 0, "refused": 0}
    clients = {"admitted": 0, "refused": 0, "latencies": []}
    lock = threading.Lock()

    def attack():
        # The attacker's own window: the clients notice `stop` only after their sleep.
        attacker["started"] = time.monotonic()
        while not stop.is_set():
            ok, _ = attempt(ATTACKER, port)
            attacker["admitted" if ok else "refused"] += 1
        attacker["seconds"] = time.monotonic() - attacker["started"]

    def client(index):
        source = f"127.0.0.{10 + index}"
        # Spread the clients over the second.
        next_at = time.monotonic() + index / CLIENTS
        while not stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            ok, latency = attempt(source, port)
            with lock:
                clients["admitted" if ok else "refused"] += 1
                if ok:
                    clients["latencies"].append(latency)
            next_at += 1.0

    threads = [threading.Thread(target=attack)]
    threads += [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    cpu_before = cpu_seconds(pids)
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(pids) - cpu_before
    latencies = sorted(clients["latencies"]) or [0.0]
    handled = attacker["admitted"] + attacker["refused"] + clients["admitted"] + clients["refused"]
    admitted = attacker["admitted"] + clients["admitted"]
    return {
        "attacker_per_sec": attacker["admitted"] / attacker["seconds"],
        "attacker_attempts_per_sec": (attacker["admitted"] + attacker["refused"])
        / attacker["seconds"],
        "clients_admitted": clients["admitted"],
        "clients_refused": clients["refused"],
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "cpu_us_per_handled": cpu / max(handled, 1) * 1e6,
        "cpu_us_per_admitted": cpu / max(admitted, 1) * 1e6,
        "seconds": elapsed,
    }


def stream_module_line(nginx):
    info = subprocess.run([nginx, "-V"], capture_output=True, text=True).stderr
    if "--with-stream=dynamic" not in info:
        return ""
    path = "modules"
    for word in info.split():
        if word.startswith("--modules-path="):
            path = word.split("=", 1)[1]
    return f"load_module {path}/ngx_stream_module.so;\n"


def start_nginx(nginx, module, port, upstream_port, prefix):
    os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
    config = f"""{stream_module_line(nginx)}load_module {module};
worker_processes 1;
user root;
error_log logs/error.log error;
pid logs/nginx.pid;
events {{ worker_connections 8192; }}
stream {{
    rate_limit_zone $binary_remote_addr zone=smtp:10m rate={LIMIT_PER_SEC}r/s;
    rate_limit_log_level info;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        rate_limit zone=smtp nodelay;
        proxy_pass 127.0.0.1:{upstream_port};
    }}
}}
"""
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(config)
    process = subprocess.Popen([nginx, "-p", prefix, "-c", "nginx.conf", "-g", "daemon off;"])
    return process, config


def start_haproxy(haproxy, port, upstream_port, prefix):
    config = f"""global
    maxconn 8000
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend smtp
    bind 127.0.0.1:{port}
    stick-table type ip size 100k expire 30s store conn_rate(1s)
    tcp-request connection track-sc0 src
    tcp-request connection reject if {{ sc_conn_rate(0) gt {LIMIT_PER_SEC} }}
    default_backend mail
backend mail
    server mail 127.0.0.1:{upstream_port}
"""
    path = os.path.join(prefix, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(config)
    process = subprocess.Popen([haproxy, "-f", path, "-db"])
    return process, config


def wait_listening(port):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nginx", required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--haproxy", default="/usr/sbin/haproxy")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--write-summary")
    args = parser.parse_args()

    stop = threading.Event()
    upstream_port = free_port()
    threading.Thread(target=upstream, args=(upstream_port, stop), daemon=True).start()
    prefix = tempfile.mkdtemp(prefix="stream-bench-")
    results = {}
    configs = {}
    for name in ["haproxy", "nginx rate_limit"]:
        port = free_port()
        if name == "haproxy":
            process, configs[name] = start_haproxy(args.haproxy, port, upstream_port, prefix)
        else:
            process, configs[name] = start_nginx(
                args.nginx, args.module, port, upstream_port, prefix
            )
        try:
            wait_listening(port)
            # The readiness probe's connection is one of 127.0.0.1's: no address of the load.
            time.sleep(1.2)
            pids = [process.pid] + children(process.pid)
            results[name] = run_load(port, pids, args.seconds)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    stop.set()
    shutil.rmtree(prefix, ignore_errors=True)

    lines = [
        "| proxy | attacker admitted/s (limit 10) | attacker attempts/s | clients admitted / refused "
        "| client p50 ms | client p99 ms | CPU µs per connection handled | CPU µs per admitted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['attacker_per_sec']:.2f} | {r['attacker_attempts_per_sec']:.0f} "
            f"| {r['clients_admitted']} / {r['clients_refused']} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['cpu_us_per_handled']:.1f} "
            f"| {r['cpu_us_per_admitted']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.write_summary:
        with open(args.write_summary, "w") as f:
            f.write(SUMMARY_HEAD.format(seconds=args.seconds))
            f.write(table + "\n\n")
            for name, config in configs.items():
                f.write(f"{name}:\n\n```\n{config}```\n\n")


SUMMARY_HEAD = """# Stream limits against HAProxy (bench/stream.sh)

One run of `bench/stream.sh` ({seconds:.0f} s per proxy, one after the other, on the shared
2-core machine: other helpers were building and testing meanwhile, so latencies and CPU are
noisy). Both proxies admit 10 new connections a second per client address in front of one TCP
upstream that sends a banner and closes. One attacker opens connections as fast as one client
thread can from 127.0.0.2; 50 well-behaved clients (127.0.0.10-59) each open one connection a
second. nginx: Debian's 1.22.1 with its stream module and this module (release build of
scripts/build-for-nginx.sh), one worker; HAProxy: Debian's, one thread, a stick table with
`conn_rate(1s)`. CPU is the proxy processes' user+system time over the run.

"""

if __name__ == "__main__":
    main()
