"""A minimal HTTP/1.1 client over one keep-alive connection.

It exists so that the instruction counts of target 1 see exactly one request per round trip
(lock-step: no pipelining, so every request costs nginx the same reads, writes and event loop
turns), and so that target 2 can push a hundred thousand requests quickly (pipelined).
Only what nginx sends back to these benches is understood: a status line, headers and a
`Content-Length` body.
"""

import socket


class ConnectionClosed(Exception):
    pass


class KeepAliveClient:
    def __init__(self, port, host="127.0.0.1", timeout=60.0):
        self.address = (host, port)
        self.timeout = timeout
        self.sock = None
        self.buffer = b""
        self.reconnects = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buffer = b""

    def _connect(self):
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buffer = b""

    @staticmethod
    def request_bytes(path):
        return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: bench\r\n\r\n"

    def _read_response(self):
        """Returns (status, keep_alive)."""
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionClosed()
            self.buffer += chunk
        head = self.buffer[:end].split(b"\r\n")
        status = int(head[0].split(b" ", 2)[1])
        length = 0
        keep_alive = True
        for line in head[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"connection" and value.strip().lower() == b"close":
                keep_alive = False
        total = end + 4 + length
        while len(self.buffer) < total:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionClosed()
            self.buffer += chunk
        self.buffer = self.buffer[total:]
        return status, keep_alive

    def get(self, path):
        """One request, waiting for its response before returning its status."""
        self._connect()
        self.sock.sendall(self.request_bytes(path))
        status, keep_alive = self._read_response()
        if not keep_alive:
            self.reconnects += 1
            self.close()
        return status

    def get_pipelined(self, paths, depth=64):
        """Statuses of `paths` in order, sent `depth` requests at a time."""
        statuses = []
        for start in range(0, len(paths), depth):
            batch = paths[start:start + depth]
            self._connect()
            self.sock.sendall(b"".join(self.request_bytes(p) for p in batch))
            for _ in batch:
                status, keep_alive = self._read_response()
                statuses.append(status)
                if not keep_alive:
                    # nginx closed after this response: resend what it did not answer.
                    raise ConnectionClosed("server closed a pipelined connection")
        return statuses
