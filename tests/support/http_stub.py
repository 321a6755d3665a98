"""One threaded HTTP stand-in server for tests: real sockets on loopback, answers decided by the test.

`HttpStub(answer, ports=n)` listens on n loopback ports (one selector thread accepts on all of them, a thread
per request answers), so a test can stand in for one server or for hundreds of them (e.g. 200 vLLM /metrics
endpoints) without a thread per port. `answer(request)` returns `(status, content_type, body)`.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class StubRequest:
    """What the stub saw: the port it came in on, the method, the path without the query, and the query."""

    port: int
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


Answer = Callable[[StubRequest], tuple[int, str, bytes | str]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many clients at once on one port must not be refused by a short listen backlog


class HttpStub:
    """Real HTTP servers on `ports` loopback ports; `urls[i]` is the i-th base URL, `url` the first."""

    def __init__(self, answer: Answer, ports: int = 1):
        if ports < 1:
            raise ValueError(f"ports={ports}: a stub listens on at least one port")
        self.answer = answer
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's hook name
                self._respond()

            def do_HEAD(self):  # noqa: N802 - http.server's hook name
                self._respond(body=False)

            def do_POST(self):  # noqa: N802 - http.server's hook name
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self._respond()

            def _respond(self, body: bool = True) -> None:
                parts = urlsplit(self.path)
                request = StubRequest(
                    port=self.server.server_address[1],
                    method=self.command,
                    path=parts.path,
                    query={k: v[0] for k, v in parse_qs(parts.query).items()},
                    headers=dict(self.headers.items()),
                )
                status, content_type, body = stub.answer(request)
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._servers = [_Server(("127.0.0.1", 0), Handler) for _ in range(ports)]
        self.ports = [server.server_address[1] for server in self._servers]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.url = self.urls[0]
        self._selector = selectors.DefaultSelector()
        for server in self._servers:
            self._selector.register(server, selectors.EVENT_READ)
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        self._stopping = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"http-stub-{self.ports[0]}", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping:
            for key, _ in self._selector.select():
                if key.fileobj is self._wake_reader or self._stopping:
                    continue
                key.fileobj._handle_request_noblock()  # accept, then a thread answers (ThreadingMixIn)

    def close(self) -> None:
        """Stop accepting and close every port; requests being answered finish on their own threads."""
        if self._stopping:
            return
        self._stopping = True
        self._wake_writer.send(b"x")
        self._thread.join(timeout=10)
        self._selector.close()
        for server in self._servers:
            server.server_close()
        self._wake_reader.close()
        self._wake_writer.close()

    def __enter__(self) -> HttpStub:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
