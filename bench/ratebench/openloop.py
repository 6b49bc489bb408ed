"""An open-loop HTTP load: requests start at random (Poisson) times at a fixed mean rate,
whatever happens to the ones before, each on its own connection with its own timeout, as
many independent clients would send them. A closed loop (a fixed number of clients each
waiting for its answer) would slow down with the server and hide a collapse.
"""

import asyncio
import random

REQUEST = b"GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


class Result:
    """One request: when it started and ended (loop seconds), its status (0: timed out or
    failed before a status line)."""

    __slots__ = ("start", "end", "status")

    def __init__(self, start, end, status):
        self.start = start
        self.end = end
        self.status = status

    @property
    def latency(self):
        return self.end - self.start


async def one_request(port, path, timeout_s, results):
    loop = asyncio.get_running_loop()
    start = loop.time()
    status = 0
    writer = None
    try:
        async def exchange():
            nonlocal writer
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST % path.encode())
            line = await reader.readline()
            parts = line.split(b" ", 2)
            code = int(parts[1]) if len(parts) > 1 else 0
            # The body is short; read it to the end (the server closes).
            await reader.read()
            return code

        status = await asyncio.wait_for(exchange(), timeout_s)
    except (asyncio.TimeoutError, OSError, ValueError):
        status = 0
    finally:
        if writer is not None:
            writer.close()
    results.append(Result(start, loop.time(), status))


async def run(port, path, rate_per_s, duration_s, timeout_s, seed, events=()):
    """Offer `rate_per_s` requests a second for `duration_s`; `events` are (seconds after the
    start, coroutine function) run at those times. Returns (start time, results); every
    request has ended (answered or timed out) when it returns."""
    started, tagged = await run_mixed(
        port, rate_per_s, duration_s, seed, lambda _rng: (path, timeout_s, None), events)
    return started, [result for _, result in tagged]


async def run_mixed(port, rate_per_s, duration_s, seed, pick, events=()):
    """As `run`, with each request's `(path, timeout_s, tag)` chosen by `pick(rng)` at its
    start (the same seeded generator draws the arrival times). Returns (start time,
    [(tag, Result)])."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    tagged = []
    tasks = set()
    started = loop.time()
    pending_events = sorted(events, key=lambda event: event[0])
    next_start = started

    async def one(path, timeout_s, tag):
        results = []
        await one_request(port, path, timeout_s, results)
        tagged.append((tag, results[0]))

    while next_start < started + duration_s:
        while pending_events and pending_events[0][0] + started <= next_start:
            _, action = pending_events.pop(0)
            task = loop.create_task(action())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        delay = next_start - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(*pick(rng)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_start += rng.expovariate(rate_per_s)
    if tasks:
        await asyncio.gather(*tasks)
    return started, tagged
