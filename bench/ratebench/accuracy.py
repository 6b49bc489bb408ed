"""Target 3: the rate admitted under overload, against the configured rate.

Per-second rates: one hot key, no burst, `wrk -t1 -c50` offering far more than the rate for
a fixed time after a short warm-up on the same key; admitted rate = responses 200 / wrk's
measured duration.

Per-minute rates ("1r/m windows"): a one-minute run cannot measure one request per minute
on one key to 1%, so KEYS keys are each limited to 1r/m and hammered at random for a bit
more than a minute. Every key passes once at its first request and once more when its minute
is up; the access log (200s only, `$msec $arg_k`) gives each key's interval between those two
admissions, and admitted rate = 60 s / mean interval, in r/m. Load on each key is dense
(every key is hit every few milliseconds), so the interval measures the limiter, not the
client. The per-minute limiters run at the same time, one wrk each.
"""

import os

from .load import finish_wrk, run_wrk, start_wrk
from .nginx import Nginx

PER_MINUTE_KEYS = 100

HTTP_BODY = """
    limit_req_zone  $arg_k zone=native_5000:1m rate=5000r/s;
    rate_limit_zone $arg_k zone=ours_5000:1m   rate=5000r/s;
    rate_limit_zone $arg_k zone=ours_sliding_window_5000:1m rate=5000r/s algorithm=sliding_window;
    rate_limit_zone $arg_k zone=ours_token_bucket_5000:1m rate=5000r/s algorithm=token_bucket;
    rate_limit_zone $arg_k zone=ours_burst1_5000:1m rate=5000r/s;

    limit_req_zone  $arg_k zone=native_100:1m rate=100r/s;
    rate_limit_zone $arg_k zone=ours_100:1m   rate=100r/s;
    rate_limit_zone $arg_k zone=ours_sliding_window_100:1m rate=100r/s algorithm=sliding_window;

    limit_req_zone  $arg_k zone=native_1m:1m rate=1r/m;
    rate_limit_zone $arg_k zone=ours_1m:1m   rate=1r/m;
    rate_limit_zone $arg_k zone=ours_token_bucket_1m:1m rate=1r/m algorithm=token_bucket;

    map $status $admitted {
        200     1;
        default 0;
    }
    log_format admitted '$msec $arg_k';

    server {
        listen 127.0.0.1:{port};

        location = /native_5000 { limit_req zone=native_5000; empty_gif; }
        location = /ours_5000   { rate_limit zone=ours_5000; rate_limit_headers off; empty_gif; }
        location = /ours_sliding_window_5000 {
            rate_limit zone=ours_sliding_window_5000; rate_limit_headers off; empty_gif;
        }
        location = /ours_token_bucket_5000 {
            rate_limit zone=ours_token_bucket_5000; rate_limit_headers off; empty_gif;
        }
        location = /ours_burst1_5000 {
            rate_limit zone=ours_burst1_5000 burst=1 nodelay; rate_limit_headers off; empty_gif;
        }

        location = /native_100 { limit_req zone=native_100; empty_gif; }
        location = /ours_100   { rate_limit zone=ours_100; rate_limit_headers off; empty_gif; }
        location = /ours_sliding_window_100 {
            rate_limit zone=ours_sliding_window_100; rate_limit_headers off; empty_gif;
        }

        location = /native_1m {
            limit_req zone=native_1m;
            access_log logs/native_1m.log admitted if=$admitted;
            empty_gif;
        }
        location = /ours_1m {
            rate_limit zone=ours_1m; rate_limit_headers off;
            access_log logs/ours_1m.log admitted if=$admitted;
            empty_gif;
        }
        location = /ours_token_bucket_1m {
            rate_limit zone=ours_token_bucket_1m; rate_limit_headers off;
            access_log logs/ours_token_bucket_1m.log admitted if=$admitted;
            empty_gif;
        }
    }
"""


def per_second(nginx, directory, location, rate, duration_s, warm_up_s):
    # The warm-up takes every algorithm out of its fresh-key state (a sliding window admits a
    # whole window at once at first), so the measured part is the steady state.
    run_wrk(f"http://127.0.0.1:{nginx.port}/{location}?k=1", warm_up_s, 50,
            out=os.path.join(directory, f"wrk.{location}.warm-up.txt"))
    result = run_wrk(f"http://127.0.0.1:{nginx.port}/{location}?k=1", duration_s, 50,
                     out=os.path.join(directory, f"wrk.{location}.txt"))
    admitted = result["passed"] / result["duration_s"]
    return {
        "configured": rate,
        "admitted": admitted,
        "error": admitted / rate - 1,
        "offered": result["requests_per_s"],
        "passed": result["passed"],
        "duration_s": result["duration_s"],
        "unit": "r/s",
    }


def admission_intervals(log_path):
    """Interval between each key's first and second admission, in seconds."""
    times = {}
    with open(log_path) as f:
        for line in f:
            msec, key = line.split()
            times.setdefault(key, []).append(float(msec))
    return [t[1] - t[0] for t in times.values() if len(t) >= 2], len(times)


def per_minute(nginx, directory, locations, duration_s):
    processes = {
        location: start_wrk(f"http://127.0.0.1:{nginx.port}/{location}", duration_s, 2,
                            keys=PER_MINUTE_KEYS,
                            out=os.path.join(directory, f"wrk.{location}.txt"))
        for location in locations
    }
    results = {}
    for location, process in processes.items():
        wrk = finish_wrk(process)
        intervals, keys_seen = admission_intervals(
            os.path.join(nginx.prefix, "logs", f"{location}.log"))
        if intervals:
            mean_interval = sum(intervals) / len(intervals)
            admitted = 60.0 / mean_interval
        else:
            mean_interval = float("nan")
            admitted = 0.0
        results[location] = {
            "configured": 1.0,
            "admitted": admitted,
            "error": admitted - 1.0,
            "offered": wrk["requests_per_s"],
            "keys_with_two_admissions": len(intervals),
            "keys": keys_seen,
            "mean_interval_s": mean_interval,
            "unit": "r/m",
        }
    return results


PER_SECOND_RUNS = {
    # name: (location, rate); the first two of each rate are the PASS/FAIL pair.
    "5000r/s": [("native_5000", 5000), ("ours_5000", 5000),
                ("ours_sliding_window_5000", 5000), ("ours_token_bucket_5000", 5000),
                # With a burst of one the bucket absorbs the arrival jitter that burst=0 loses.
                ("ours_burst1_5000", 5000)],
    "100r/s": [("native_100", 100), ("ours_100", 100), ("ours_sliding_window_100", 100)],
}
PER_MINUTE_LOCATIONS = ["native_1m", "ours_1m", "ours_token_bucket_1m"]


def run(binaries, directory, duration_s=10, warm_up_s=2, per_second_runs=PER_SECOND_RUNS,
        per_minute_s=70, log=print):
    """{(rate name, location): result}. `per_minute_s` 0 skips the per-minute part."""
    os.makedirs(directory, exist_ok=True)
    results = {}
    with Nginx(binaries, os.path.join(directory, "prefix"), HTTP_BODY) as nginx:
        for name, runs in per_second_runs.items():
            for location, rate in runs:
                log(f"  accuracy: {name:8} /{location} ({duration_s}s)")
                results[(name, location)] = per_second(nginx, directory, location, rate,
                                                       duration_s, warm_up_s)
        if per_minute_s:
            log(f"  accuracy: 1r/m x {PER_MINUTE_KEYS} keys, {', '.join(PER_MINUTE_LOCATIONS)}"
                f" together ({per_minute_s}s)")
            for location, result in per_minute(nginx, directory, PER_MINUTE_LOCATIONS,
                                               per_minute_s).items():
                results[("1r/m", location)] = result
    return results
