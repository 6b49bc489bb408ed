#!/usr/bin/python3
"""A real gRPC server and client (grpcio) for t/grpc.rs, with no generated stubs: the
methods are generic handlers that pass raw bytes.

    grpc_peer.py server            serve test.Echo on a free port; print "PORT N" when ready
    grpc_peer.py MODE PORT KEY     run a scenario (calls, long, paced, plain, crowd) on nginx
                                   on PORT; print its outcome as one JSON value

test.Echo/Unary answers its request; test.Echo/Stream answers three messages. Every call
sends `x-key: KEY-<scenario>` metadata, which nginx's zones use as their key.
"""

import json
import sys
import time
from concurrent import futures

try:
    import grpc
except ImportError:
    print("grpcio is missing: install python3-grpcio (apt-get install python3-grpcio)",
          file=sys.stderr)
    sys.exit(3)


def serve():
    def unary(request, context):
        return request

    def stream(request, context):
        for _ in range(3):
            yield request

    def slow(request, context):
        time.sleep(2)
        return request

    handler = grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    server.wait_for_termination()


def outcome(call):
    """(status name, details, trailing metadata as a dict) of a finished call or error."""
    return {
        "code": call.code().name,
        "details": call.details(),
        "trailers": {key: value for key, value in (call.trailing_metadata() or ())},
    }


def unary(channel, key, timeout=10, name="Unary"):
    method = channel.unary_unary(f"/test.Echo/{name}")
    started = time.monotonic()
    try:
        _, call = method.with_call(b"ping", metadata=(("x-key", key),), timeout=timeout)
        result = outcome(call)
    except grpc.RpcError as error:
        result = outcome(error)
    result["elapsed_ms"] = round((time.monotonic() - started) * 1000)
    return result


def server_stream(channel, key):
    method = channel.unary_stream("/test.Echo/Stream")
    call = method(b"ping", metadata=(("x-key", key),), timeout=10)
    messages = 0
    try:
        for _ in call:
            messages += 1
    except grpc.RpcError:
        pass
    result = outcome(call)
    result["messages"] = messages
    return result


def retrying_channel(target):
    """A channel whose calls retry RESOURCE_EXHAUSTED quickly by their own backoff (at most
    50 ms): a retry that waits longer waits for the server's pushback."""
    config = {
        "methodConfig": [{
            "name": [{"service": "test.Echo"}],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.01s",
                "maxBackoff": "0.05s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
            },
        }],
    }
    options = [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(config)),
    ]
    return grpc.insecure_channel(target, options=options)


def calls(port, key):
    """Against a zone of 1r/m, burst 2, nodelay: five unary calls, then server-streaming calls
    of another key (three pass, the fourth is refused)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        results = {
            "unary": [unary(channel, f"{key}-unary") for _ in range(5)],
            "stream": [server_stream(channel, f"{key}-stream") for _ in range(4)],
        }
    print(json.dumps(results), flush=True)


def long(port, key):
    """Against a zone of 1r/m without burst, with the retry policy: the first call passes, the
    second is refused with a pushback of a minute, longer than its 3 s deadline: it is not
    retried (it ends DEADLINE_EXCEEDED), where the policy's own backoff would retry it four
    times within 150 ms."""
    with retrying_channel(f"127.0.0.1:{port}") as channel:
        results = [unary(channel, f"{key}-long", timeout=3) for _ in range(2)]
    print(json.dumps(results), flush=True)


def crowd(port, key):
    """Two slow calls (2 s each) at once against a concurrency zone of limit=1: one is served,
    the other refused while the first is in flight."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with futures.ThreadPoolExecutor(max_workers=2) as pool:
            calls = [pool.submit(unary, channel, f"{key}-crowd", 10, "Slow") for _ in range(2)]
            results = [call.result() for call in calls]
    print(json.dumps(results), flush=True)


def paced(port, key):
    """Against a zone of 30r/m without burst (one call every 2 s): the second call is refused
    with a pushback of about 2 s, which the retry policy waits for, and then passes."""
    with retrying_channel(f"127.0.0.1:{port}") as channel:
        results = [unary(channel, f"{key}-paced") for _ in range(2)]
    print(json.dumps(results), flush=True)


def plain(port, key):
    """Five calls with no retry policy, for the status a refusal maps to."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        results = [unary(channel, f"{key}-plain") for _ in range(5)]
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "server":
        serve()
    elif mode == "calls":
        calls(int(sys.argv[2]), sys.argv[3])
    elif mode == "long":
        long(int(sys.argv[2]), sys.argv[3])
    elif mode == "crowd":
        crowd(int(sys.argv[2]), sys.argv[3])
    elif mode == "paced":
        paced(int(sys.argv[2]), sys.argv[3])
    elif mode == "plain":
        plain(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(f"unknown mode {mode}")
