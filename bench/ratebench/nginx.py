"""One nginx for one bench step: a prefix directory, a generated config, start, stop.

Every bench runs native `limit_req` and `rate_limit` in the same binary and the same config
(different locations), so both see the same build, event loop and load.
"""

import os
import shutil
import signal
import socket
import subprocess
import time

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_per_limiter(directives):
    """One server per limiter, each with the single location `/t` serving `empty_gif`:
    `directives` maps a name to the location's limiting directives, the first (the baseline)
    listening on `{port}` and the others on `{port:NAME}` (give `port_names` the others).
    The same URI and location lookup for all: nginx's work outside the limiter is equal."""
    blocks = []
    for index, (name, lines) in enumerate(directives.items()):
        port = "{port}" if index == 0 else "{port:" + name + "}"
        body = "".join(f"            {line}\n" for line in lines)
        blocks.append(f"""    server {{
        listen 127.0.0.1:{port};
        location = /t {{
{body}            empty_gif;
        }}
    }}
""")
    return "".join(blocks)


class Binaries:
    """The nginx binary and the module, copied once per bench run so that builds made by
    others in the same checkout while the bench runs cannot change what is measured."""

    def __init__(self, nginx, module):
        self.nginx = nginx
        self.module = module

    @staticmethod
    def snapshot(nginx, module, directory):
        os.makedirs(directory, exist_ok=True)
        nginx_copy = os.path.join(directory, "nginx")
        module_copy = os.path.join(directory, os.path.basename(module))
        shutil.copy2(nginx, nginx_copy)
        shutil.copy2(module, module_copy)
        return Binaries(nginx_copy, module_copy)


def render_config(binaries, prefix, port, http_body, workers=1, master=True, ports=None):
    """A whole nginx.conf: `http_body` goes inside `http { }` and may use `{port}`, and
    `{port:NAME}` for each NAME of `ports` (a dict of more ports)."""
    for name, extra in (ports or {}).items():
        http_body = http_body.replace("{port:" + name + "}", str(extra))
    return f"""load_module {binaries.module};
user root;
daemon off;
master_process {"on" if master else "off"};
worker_processes {workers};
pid {prefix}/logs/nginx.pid;
error_log {prefix}/logs/error.log warn;
worker_rlimit_nofile 8192;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    limit_req_status 429;
    rate_limit_status 429;
    limit_req_log_level info;
    rate_limit_log_level info;

{http_body.replace("{port}", str(port))}
}}
"""


class Nginx:
    """nginx started from `config_body` (see `render_config`), optionally under a wrapper
    command such as valgrind. Use as a context manager; the prefix is kept for inspection."""

    def __init__(self, binaries, prefix, http_body, workers=1, master=True, wrapper=None,
                 port_names=()):
        self.binaries = binaries
        self.prefix = os.path.abspath(prefix)
        self.port = free_port()
        # More listening ports, one per name, for a body with a server per port.
        self.ports = {}
        for name in port_names:
            port = free_port()
            while port == self.port or port in self.ports.values():
                port = free_port()
            self.ports[name] = port
        self.workers = workers
        self.master = master
        self.wrapper = wrapper or []
        os.makedirs(os.path.join(self.prefix, "logs"), exist_ok=True)
        self.config_path = os.path.join(self.prefix, "nginx.conf")
        with open(self.config_path, "w") as f:
            f.write(render_config(binaries, self.prefix, self.port, http_body, workers, master,
                                  self.ports))
        self.process = None

    def port_of(self, name):
        """The port of the server called `name` in `port_names`; the main port otherwise."""
        return self.ports.get(name, self.port)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def error_log(self):
        return os.path.join(self.prefix, "logs", "error.log")

    def start(self):
        command = self.wrapper + [self.binaries.nginx, "-p", self.prefix, "-c", self.config_path]
        stderr = open(os.path.join(self.prefix, "stderr.log"), "w")
        self.process = subprocess.Popen(command, stdout=stderr, stderr=stderr,
                                        start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited at start; see {self.prefix}/stderr.log and "
                                   f"{self.error_log}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not listen on {self.port} within {START_TIMEOUT_S}s")

    def stop(self):
        """Graceful stop (SIGQUIT), so valgrind writes its output; SIGKILL if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        # With `master_process off` a signal that lands between nginx's check of its quit
        # flag and epoll_wait() is only seen at the next event, and with no timer pending
        # there is none: repeat the signal until it exits.
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            self.process.send_signal(signal.SIGQUIT)
            try:
                self.process.wait(1.0)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def worker_pids(self):
        """The master's children (its workers); with `master_process off`, the process."""
        if not self.master:
            return [self.process.pid]
        path = f"/proc/{self.process.pid}/task/{self.process.pid}/children"
        with open(path) as f:
            return [int(pid) for pid in f.read().split()]

    def workers_cpu_s(self):
        """CPU seconds (user + system) the workers have used so far. Loopback packets are
        partly processed in softirq context and not charged to any process: this counts what
        nginx itself does, which is what differs between two limiters."""
        user, system, _ = self.workers_cpu()
        return user + system

    def workers_cpu(self):
        """(user, system, total) CPU seconds the workers have used so far: user and system
        in clock ticks (/proc/PID/stat, 10 ms), the total to the nanosecond
        (/proc/PID/schedstat)."""
        user = system = total = 0
        for pid in self.worker_pids():
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
        return user / tick, system / tick, total / 1e9

    def error_lines(self, level):
        """Lines of the error log at `level` (e.g. "[alert]")."""
        try:
            with open(self.error_log) as f:
                return [line for line in f if level in line]
        except FileNotFoundError:
            return []
