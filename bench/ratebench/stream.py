"""Stream limits against HAProxy (issue 30): both admit 10 new connections a second per
client address in front of one TCP upstream. One attacker opens connections as fast as it can
from 127.0.0.2; 50 well-behaved clients (127.0.0.10-59) each open one connection a second.

Reports, for each proxy: the attacker's admitted connections per second against the limit,
the well-behaved clients' connect-to-banner latency (p50, p99) and refusals, and the proxy's
CPU time per connection it handled (admitted or refused) and per admitted connection.

    python3 -m ratebench.stream --nginx /usr/sbin/nginx --module M.so [--seconds 10] [--rounds 6]

CPU per connection is compared as a ratio with a confidence interval over rounds in which the
proxies take turns: one run of each is not a measurement on a shared machine (two re-runs
once gave 35.9 / 22.7 µs and 27.9 / 38.9 µs, ours / HAProxy's).
"""

import argparse
import math
import os
import shutil
import signal
import socket
import statistics
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


# Two-sided 95% quantiles of Student's t distribution, by degrees of freedom (1-30).
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def ratio_interval(ratios):
    """The geometric mean of per-round ratios and its 95% confidence interval (a t interval
    on the ratios' logarithms: a ratio and its inverse are equally far from 1)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = T95[min(len(logs) - 1, len(T95)) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def run_one(name, args, upstream_port, prefix):
    port = free_port()
    if name == "haproxy":
        process, config = start_haproxy(args.haproxy, port, upstream_port, prefix)
    else:
        process, config = start_nginx(args.nginx, args.module, port, upstream_port, prefix)
    try:
        wait_listening(port)
        # The readiness probe's connection is one of 127.0.0.1's: no address of the load.
        time.sleep(1.2)
        pids = [process.pid] + children(process.pid)
        return run_load(port, pids, args.seconds), config
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nginx", required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--haproxy", default="/usr/sbin/haproxy")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--write-summary")
    args = parser.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")

    names = ["haproxy", "nginx rate_limit"]
    stop = threading.Event()
    upstream_port = free_port()
    threading.Thread(target=upstream, args=(upstream_port, stop), daemon=True).start()
    prefix = tempfile.mkdtemp(prefix="stream-bench-")
    runs = {name: [] for name in names}
    configs = {}
    # The proxies take turns, the order alternating from round to round, so that a machine
    # that gets busier or quieter during the bench weighs on both alike; each round's ratio
    # compares two runs made side by side.
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            result, configs[name] = run_one(name, args, upstream_port, prefix)
            runs[name].append(result)
            print(
                f"round {round_index + 1}/{args.rounds} {name}: "
                f"{result['cpu_us_per_handled']:.1f} µs per connection handled",
                flush=True,
            )
    stop.set()
    shutil.rmtree(prefix, ignore_errors=True)

    lines = [
        "| proxy | attacker admitted/s (limit 10) | attacker attempts/s | clients admitted / refused "
        "| client p50 ms | client p99 ms | CPU µs per connection handled | CPU µs per admitted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        median = lambda key: statistics.median(r[key] for r in runs[name])  # noqa: E731
        admitted = sum(r["clients_admitted"] for r in runs[name])
        refused = sum(r["clients_refused"] for r in runs[name])
        lines.append(
            f"| {name} | {median('attacker_per_sec'):.2f} "
            f"| {median('attacker_attempts_per_sec'):.0f} | {admitted} / {refused} "
            f"| {median('p50_ms'):.2f} | {median('p99_ms'):.2f} "
            f"| {median('cpu_us_per_handled'):.1f} | {median('cpu_us_per_admitted'):.1f} |"
        )
    ratios = [
        ours["cpu_us_per_handled"] / theirs["cpu_us_per_handled"]
        for ours, theirs in zip(runs["nginx rate_limit"], runs["haproxy"])
    ]
    ratio, low, high = ratio_interval(ratios)
    per_round = ", ".join(f"{r:.2f}" for r in ratios)
    verdict = "at or below HAProxy's" if high <= 1.0 else (
        "above HAProxy's" if low > 1.0 else "not distinguishable from HAProxy's")
    ratio_line = (
        f"CPU per connection handled, nginx rate_limit / HAProxy: **{ratio:.2f}** "
        f"(95% confidence interval {low:.2f}-{high:.2f}, {args.rounds} rounds; per round: "
        f"{per_round}): {verdict}."
    )
    table = "\n".join(lines)
    print(table)
    print(ratio_line)
    if args.write_summary:
        with open(args.write_summary, "w") as f:
            f.write(SUMMARY_HEAD.format(seconds=args.seconds, rounds=args.rounds))
            f.write(table + "\n\n" + ratio_line + "\n\n")
            for name, config in configs.items():
                f.write(f"{name}:\n\n```\n{config}```\n\n")


SUMMARY_HEAD = """# Stream limits against HAProxy (bench/stream.sh)

{rounds} rounds of `bench/stream.sh`, {seconds:.0f} s per proxy per round; in each round the
two proxies run one after the other, the order alternating from round to round. The table
gives each figure's median over the rounds (clients' connections summed); the ratio below it
is the geometric mean of the rounds' ratios with a 95% t interval on their logarithms. Both
proxies admit 10 new connections a second per client address in front of one TCP upstream that
sends a banner and closes. One attacker opens connections as fast as one client thread can
from 127.0.0.2; 50 well-behaved clients (127.0.0.10-59) each open one connection a second.
nginx: Debian's 1.22.1 with its stream module and this module (release build of
scripts/build-for-nginx.sh), one worker; HAProxy: Debian's, one thread, a stick table with
`conn_rate(1s)`. CPU is the proxy processes' user+system time over the run.

"""

if __name__ == "__main__":
    main()
