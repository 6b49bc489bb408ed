"""Target 4: requests per second and p99 latency with wrk on loopback.

One nginx per worker count, with five servers, each on its own port with one location `/t`
(so nginx's parsing and location lookup are the same for all): no limit, limit_req,
rate_limit with headers off (the comparison: limit_req adds none), rate_limit with its
headers, and a second limit_req identical to the first (native against itself: how far a
paired ratio strays when there is no difference). Rates are so high and bursts so large that
nothing is rejected (checked: any non-2xx fails the run).
Before measuring, every limited location sees each of the 100,000 keys once, so the runs
measure a zone holding all of them rather than its filling. Besides req/s and p99, each run
records the workers' CPU time per request (from /proc): far less disturbed by other work on
the machine than req/s, though not a target of the issue. Runs alternate between the
locations, in reverse order every other repetition, so native and ours always run back to
back. The checks use the median over repetitions of ours/native within a repetition, which
cancels the machine's slower drifts; the medians of each location are reported too. On a
2-core machine where wrk and nginx share the cores, single runs are noisy.
Nothing is pinned: pinning wrk to one core made it the bottleneck.
"""

import math
import os
import statistics

from .client import KeepAliveClient
from .load import run_wrk
from .nginx import Nginx, server_per_limiter

KEYS = 100_000
CONNECTIONS = 50

HTTP_BODY = """
    limit_req_zone  $arg_k zone=native:32m rate=1000000r/s;
    rate_limit_zone $arg_k zone=ours:32m   rate=1000000r/s;
    rate_limit_zone $arg_k zone=ours_headers:32m rate=1000000r/s;
    limit_req_zone  $arg_k zone=native_twin:32m rate=1000000r/s;

""" + server_per_limiter({
    "none": [],
    "native": ["limit_req zone=native burst=1000000 nodelay;"],
    "ours": ["rate_limit zone=ours burst=1000000 nodelay;", "rate_limit_headers off;"],
    "ours_headers": ["rate_limit zone=ours_headers burst=1000000 nodelay;"],
    "native_twin": ["limit_req zone=native_twin burst=1000000 nodelay;"],
})

# `native_twin` is a second, identical limit_req server: native against itself, the noise
# floor of a paired ratio in the same run (an info row).
LOCATIONS = ["none", "native_twin", "native", "ours", "ours_headers"]
KEY_SETS = {"hot": None, "100k": KEYS}


def prefill(nginx, locations):
    for location in locations:
        with KeepAliveClient(nginx.port_of(location), timeout=120) as client:
            statuses = client.get_pipelined([f"/t?k={i}" for i in range(1, KEYS + 1)])
            if statuses.count(200) != KEYS:
                raise RuntimeError(f"prefill of /{location}: not all 200")


# With one hot key the limiter is about 1% of nginx's work per request, well under the
# run-to-run noise: more back-to-back native/ours pairs for it (the other locations are
# context and keep the common repetitions).
HOT_EXTRA_PAIRS = 16


def run(binaries, directory, workers_list=(1, 2), repetitions=9, duration_s=3,
        locations=LOCATIONS, hot_extra_pairs=HOT_EXTRA_PAIRS, log=print):
    """{(workers, key set, location): {"runs": [...], "rps": median, "p99_ms": median}}."""
    os.makedirs(directory, exist_ok=True)
    runs = {}
    for workers in workers_list:
        prefix = os.path.join(directory, f"prefix-{workers}w")
        with Nginx(binaries, prefix, HTTP_BODY, workers=workers,
                   port_names=LOCATIONS[1:]) as nginx:
            log(f"  throughput: {workers} worker(s): prefilling {KEYS} keys")
            prefill(nginx, [location for location in locations if location != "none"])
            schedule = [(repetition, KEY_SETS.items(), locations)
                        for repetition in range(repetitions)]
            pair = [location for location in locations if location in ("native", "ours")]
            schedule += [(repetition, [("hot", None)], pair)
                         for repetition in range(repetitions, repetitions + hot_extra_pairs)]
            for repetition, key_sets, chosen in schedule:
                order = chosen if repetition % 2 == 0 else list(reversed(chosen))
                for key_set, keys in key_sets:
                    for location in order:
                        url = f"http://127.0.0.1:{nginx.port_of(location)}/t"
                        if keys is None:
                            url += "?k=1"
                        out = os.path.join(directory, f"wrk.{workers}w.{key_set}.{location}."
                                                      f"{repetition}.txt")
                        cpu_before = nginx.workers_cpu_s()
                        result = run_wrk(url, duration_s, CONNECTIONS, keys=keys, out=out)
                        result["worker_cpu_us_per_request"] = (
                            (nginx.workers_cpu_s() - cpu_before) * 1e6 / result["requests"])
                        if result["non_2xx_3xx"] or result["connect_errors"] or \
                                result["read_errors"] or result["timeouts"]:
                            raise RuntimeError(f"{out}: errors or non-2xx in a throughput run")
                        runs.setdefault((workers, key_set, location), []).append(result)
                        log(f"  throughput: {workers}w {key_set:4} /{location:12} "
                            f"{result['requests_per_s']:9.0f} req/s  "
                            f"p99 {result['p99_us'] / 1000:.2f} ms  "
                            f"worker CPU {result['worker_cpu_us_per_request']:.2f} us/request")
    return {
        key: {
            "runs": results,
            "rps": statistics.median(r["requests_per_s"] for r in results),
            "p99_ms": statistics.median(r["p99_us"] for r in results) / 1000,
            "rps_min": min(r["requests_per_s"] for r in results),
            "rps_max": max(r["requests_per_s"] for r in results),
            "cpu_us": statistics.median(r["worker_cpu_us_per_request"] for r in results),
        }
        for key, results in runs.items()
    }


def paired_ratios(throughput, workers, key_set, location, field):
    """`location`'s `field` over native's in the same repetition, one per repetition (runs of
    one repetition are back to back; a location with fewer repetitions than native is paired
    with native's first ones, which ran with it). Their median is what the checks compare
    with 1."""
    ours = throughput[(workers, key_set, location)]["runs"]
    native = throughput[(workers, key_set, "native")]["runs"]
    return [o[field] / n[field] for o, n in zip(ours, native)]


def median_interval(values, confidence=0.95):
    """A distribution-free confidence interval for the median of `values`: the order
    statistics k and n + 1 - k, with k the largest for which P(Binomial(n, 1/2) < k) is at
    most (1 - confidence) / 2. None when there are too few values for one."""
    n = len(values)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0
    while k < n:
        below += math.comb(n, k) / 2 ** n
        if below > tail:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]
