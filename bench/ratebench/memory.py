"""Target 2: how many keys a zone of known size remembers.

Each limiter gets its own 1 MiB zone (`rate=1r/m`, no burst). Pass 1 sends each of N distinct
keys once: every request passes and leaves a state that stays non-idle for a minute. Pass 2
sends every key again, newest first: a key the zone still remembers is rejected (429), a key
it forgot passes. Rejections in pass 2 = keys remembered.

Why newest first: a forgotten key in pass 2 is inserted again and pushes some other key out.
For limit_req (a least-recently-used list; a rejected lookup moves its node to the front)
this order is exact: every remembered key is checked before the first miss evicts anything.
For rate_limit (a set-associative table that evicts the entry closest to idle in the key's
probe window) misses can still evict remembered keys not yet checked, so the count is a
slight undercount (about 4% by simulation of the table): the order is conservative for ours.
Both passes take seconds; a state stays remembered-and-limited for 60 s (62.5 s for
limit_req, whose integer rate truncates 1r/m), so time does not forget anything.
"""

import os

from .client import KeepAliveClient
from .nginx import Nginx

ZONE = "1m"
ZONE_BYTES = 1 << 20

HTTP_BODY = f"""
    limit_req_zone  $arg_k zone=native_short:{ZONE} rate=1r/m;
    limit_req_zone  $arg_k zone=native_long:{ZONE}  rate=1r/m;
    rate_limit_zone $arg_k zone=ours_short:{ZONE}   rate=1r/m;
    rate_limit_zone $arg_k zone=ours_long:{ZONE}    rate=1r/m;

    server {{
        listen 127.0.0.1:{{port}};

        location = /native_short {{ limit_req zone=native_short nodelay; empty_gif; }}
        location = /native_long  {{ limit_req zone=native_long  nodelay; empty_gif; }}
        location = /ours_short   {{ rate_limit zone=ours_short  nodelay; empty_gif; }}
        location = /ours_long    {{ rate_limit zone=ours_long   nodelay; empty_gif; }}
    }}
"""

KEY_LENGTHS = {"short": 8, "long": 64}


def key(i, length):
    """A distinct key of exactly `length` bytes (URL-safe)."""
    digits = f"{i:08x}"
    return ("k" * (length - len(digits))) + digits


def remembered(client, location, length, keys):
    paths = [f"/{location}?k={key(i, length)}" for i in range(keys)]
    first = client.get_pipelined(paths)
    passed_first = first.count(200)
    second = client.get_pipelined(list(reversed(paths)))
    return {
        "keys_sent": keys,
        "first_pass_passed": passed_first,
        "remembered": second.count(429),
        "forgotten": second.count(200),
        "other": len(second) - second.count(429) - second.count(200),
    }


def run(binaries, directory, keys, log=print):
    """{(limiter, length_name): counts}, keys remembered per MiB included."""
    os.makedirs(directory, exist_ok=True)
    results = {}
    with Nginx(binaries, os.path.join(directory, "prefix"), HTTP_BODY) as nginx:
        with KeepAliveClient(nginx.port, timeout=120) as client:
            for length_name, length in KEY_LENGTHS.items():
                for limiter in ("native", "ours"):
                    log(f"  memory: {limiter:6} {length}-byte keys, {keys} keys")
                    counts = remembered(client, f"{limiter}_{length_name}", length, keys)
                    counts["per_mib"] = counts["remembered"] * (1 << 20) / ZONE_BYTES
                    results[(limiter, length_name)] = counts
    return results
