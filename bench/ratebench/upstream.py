"""A synthetic upstream that collapses under overload (the protect bench, issue 23).

It serves `capacity` requests at once in `base_ms` each and shares itself out beyond that
(processor sharing): with n > capacity requests in flight, each progresses at capacity / n,
so a request takes about base_ms * max(1, n / capacity). It only sleeps (a timer per next
completion), so its speed does not depend on the machine's CPU. A request whose client went
away is still worked on until done, as a busy server does not notice: this is what makes an
unprotected upstream collapse.

    python3 -m ratebench.upstream --port PORT --capacity C --base-ms B [--shape SHAPE]

Shapes (`--shape`, issue 27): `ps` (the above, the default); `fifo`, a pool of C workers with
a FIFO backlog (latency = wait + b); `bimodal`, that pool with cache hits and misses (70% take
b / 4, 30% take 2.75 b: the mean is b).

`GET /_capacity/N` sets the capacity to N (answers at once, not counted); `GET /_stats`
answers `in_flight completed capacity`. `GET /slow/...` takes 1-2 s (uniform) without using
the upstream's capacity: a slow path that waits on something else. Every other request is
one unit of work, answered `200` with a short body. Listens on 127.0.0.1 only.
"""

import argparse
import asyncio
import collections
import heapq
import itertools
import os
import random
import subprocess
import sys
import time
import urllib.request


class ProcessorSharing:
    """Requests in flight, each needing `base_s` of work, sharing `capacity` servers.

    All requests progress at the same speed, so the "virtual time" (work done by any request
    in flight since the start) tells when each is done: a request admitted at virtual time v
    is done at v + base_s. A heap orders them; one timer waits for the first.
    """

    def __init__(self, loop, capacity, base_s):
        self.loop = loop
        self.capacity = capacity
        self.base_s = base_s
        self.virtual_s = 0.0
        self.updated_at = loop.time()
        self.heap = []
        self.sequence = itertools.count()
        self.timer = None
        self.completed = 0

    def speed(self):
        n = len(self.heap)
        return 1.0 if n <= self.capacity else self.capacity / n

    def advance(self):
        now = self.loop.time()
        self.virtual_s += (now - self.updated_at) * self.speed()
        self.updated_at = now

    def work(self):
        """A future done when one request's work is."""
        self.advance()
        done = self.loop.create_future()
        heapq.heappush(self.heap, (self.virtual_s + self.base_s, next(self.sequence), done))
        self.reschedule()
        return done

    def set_capacity(self, capacity):
        self.advance()
        self.capacity = capacity
        self.reschedule()

    def reschedule(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.heap:
            wait = max(0.0, (self.heap[0][0] - self.virtual_s) / self.speed())
            self.timer = self.loop.call_later(wait, self.on_timer)

    def on_timer(self):
        self.timer = None
        self.advance()
        # Float rounding: anything within a microsecond of done is done.
        while self.heap and self.heap[0][0] <= self.virtual_s + 1e-6:
            _, _, done = heapq.heappop(self.heap)
            self.completed += 1
            if not done.done():
                done.set_result(None)
        self.reschedule()


class FifoPool:
    """`capacity` workers (whole ones, at least one) and a FIFO backlog. With `bimodal`, 70%
    of the requests take base_s / 4 and 30% take 2.75 base_s."""

    def __init__(self, loop, capacity, base_s, bimodal, seed=27):
        self.loop = loop
        self.capacity = capacity
        self.base_s = base_s
        self.bimodal = bimodal
        self.rng = random.Random(seed)
        self.busy = 0
        self.backlog = collections.deque()
        self.completed = 0

    @property
    def heap(self):
        """What /_stats counts as in flight (named as the processor-sharing upstream's)."""
        return [None] * (self.busy + len(self.backlog))

    def workers(self):
        return max(1, int(self.capacity))

    def service_s(self):
        if not self.bimodal:
            return self.base_s
        return self.base_s / 4 if self.rng.random() < 0.7 else self.base_s * 2.75

    async def work(self):
        service = self.service_s()
        if self.busy < self.workers() and not self.backlog:
            self.busy += 1
        else:
            turn = self.loop.create_future()
            self.backlog.append(turn)
            # The worker is handed over with the future (busy counted by the hand-over).
            await turn
        try:
            await asyncio.sleep(service)
        finally:
            self.busy -= 1
            self.completed += 1
            self.dispatch()

    def dispatch(self):
        while self.backlog and self.busy < self.workers():
            turn = self.backlog.popleft()
            if turn.done():
                continue
            self.busy += 1
            turn.set_result(None)

    def set_capacity(self, capacity):
        self.capacity = capacity
        self.dispatch()


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].split(b" ")


async def serve(upstream, reader, writer):
    """One request per connection (nginx's proxy_pass opens one per request by default)."""
    try:
        try:
            request_line = await read_head(reader)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return
        path = request_line[1].decode() if len(request_line) > 1 else "/"
        if path.startswith("/_capacity/"):
            upstream.set_capacity(float(path.rsplit("/", 1)[1]))
            body = b"ok\n"
        elif path.startswith("/slow/"):
            await asyncio.sleep(1.0 + random.random())
            body = b"slow\n"
        elif path == "/_stats":
            body = f"{len(upstream.heap)} {upstream.completed} {upstream.capacity}\n".encode()
        else:
            await upstream.work()
            body = b"done\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (len(body), body))
        try:
            await writer.drain()
        except ConnectionError:
            return
    finally:
        writer.close()


async def main(port, capacity, base_ms, shape="ps"):
    loop = asyncio.get_running_loop()
    if shape == "ps":
        upstream = ProcessorSharing(loop, capacity, base_ms / 1000.0)
    else:
        upstream = FifoPool(loop, capacity, base_ms / 1000.0, bimodal=shape == "bimodal")
    server = await asyncio.start_server(lambda r, w: serve(upstream, r, w), "127.0.0.1", port,
                                        backlog=4096)
    async with server:
        await server.serve_forever()


class UpstreamProcess:
    """This upstream in a process of its own, on a free port, for the benches that drive it;
    its output goes to `upstream.log` in `directory`."""

    def __init__(self, root, directory, capacity, base_ms, shape=None):
        from .nginx import free_port
        self.port = free_port()
        self.log = open(os.path.join(directory, "upstream.log"), "w")
        command = [sys.executable, "-m", "ratebench.upstream", "--port", str(self.port),
                   "--capacity", str(capacity), "--base-ms", str(base_ms)]
        if shape is not None:
            command += ["--shape", shape]
        self.process = subprocess.Popen(command, cwd=os.path.join(root, "bench"),
                                        stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.get("/_stats")
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("the synthetic upstream did not start")

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
            return answer.read().decode()

    def stop(self):
        self.process.terminate()
        self.process.wait()
        self.log.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capacity", type=float, required=True)
    parser.add_argument("--base-ms", type=float, required=True)
    parser.add_argument("--shape", choices=["ps", "fifo", "bimodal"], default="ps")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.capacity, args.base_ms, args.shape))
