"""wrk runs, read through the JSON line that bench/wrk/*.lua print when a run ends."""

import json
import os
import subprocess

WRK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wrk")


def start_wrk(url, duration_s, connections, keys=None, threads=1, out=None):
    """Starts wrk; `keys` = None hits `url` as is (one hot key in the URL), otherwise
    `url?k=<random 1..keys>`. Returns the process; pass it to `finish_wrk`."""
    script = "report.lua" if keys is None else "random_keys.lua"
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--latency",
               "-s", os.path.join(WRK_DIR, script), url]
    if keys is not None:
        command += ["--", str(keys)]
    stdout = open(out, "w") if out else subprocess.PIPE
    process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT, text=True)
    process.bench_out = out
    process.bench_command = command
    return process


def finish_wrk(process):
    output, _ = process.communicate(timeout=600)
    if process.bench_out:
        with open(process.bench_out) as f:
            output = f.read()
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed ({process.returncode}): {output}")
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            result["duration_s"] = result["duration_us"] / 1e6
            result["passed"] = result["requests"] - result["non_2xx_3xx"]
            result["requests_per_s"] = result["requests"] / result["duration_s"]
            return result
    raise RuntimeError(f"no summary line from wrk: {output}")


def run_wrk(url, duration_s, connections, keys=None, threads=1, out=None):
    return finish_wrk(start_wrk(url, duration_s, connections, keys, threads, out))
