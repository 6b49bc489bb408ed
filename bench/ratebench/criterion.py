"""Target 5: the criterion bench of ratelimit-core, read back from criterion's estimates."""

import json
import os
import subprocess

OURS = ["leaky_bucket", "token_bucket", "sliding_window", "sliding_log"]
GOVERNOR = ["keyed_dashmap", "keyed_hashmap"]


def run(root, directory, log=print):
    """{("ours"|"governor", name): ns per decision, criterion's median (other work on a shared
    machine shows up as outliers, which move the mean)}."""
    os.makedirs(directory, exist_ok=True)
    log("  criterion: cargo bench -p ratelimit-core --bench algorithms")
    env = dict(os.environ, CRITERION_HOME=os.path.abspath(directory))
    with open(os.path.join(directory, "cargo-bench.txt"), "w") as out:
        subprocess.run(["cargo", "bench", "-p", "ratelimit-core", "--bench", "algorithms"],
                       cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
    results = {}
    for side, names in (("ours", OURS), ("governor", GOVERNOR)):
        for name in names:
            path = os.path.join(directory, "decision", side, name, "new", "estimates.json")
            with open(path) as f:
                results[(side, name)] = json.load(f)["median"]["point_estimate"]
    return results
