"""A reverse proxy on loopback between a worker and its MLflow server that kills the worker at a chosen request.

A kill -9 timed from outside (a file appearing) cannot land between two registry calls; this one can. A rule names
a request (method, path, and words its body must contain) and whether the kill comes before the request reaches
MLflow (the call never happened) or after MLflow answered (the call happened; the worker never learned). The worker
and everything it started die, as when its host or container goes.
"""

from __future__ import annotations

import http.client
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class KillRule:
    """Kill the worker at the `nth` request matching method, path fragment and body words; `when` is before|after."""

    method: str
    path_contains: str
    body_contains: tuple[str, ...] = ()
    when: str = "before"
    nth: int = 1
    seen: int = 0
    fired: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, path: str, body: bytes) -> bool:
        return (
            method == self.method
            and self.path_contains in path
            and all(word.encode() in body for word in self.body_contains)
        )


def kill_process_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (servers it started sit in process groups of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    # Not the root: waiting here would reap it, and its Popen would then report exit code 0 instead of -9.
    psutil.wait_procs(family[:-1], timeout=30)


class FaultProxy:
    """Forwards every request to `upstream`; when `rule` matches, kills the process tree of `worker_pid`."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.rule: KillRule | None = None
        self.worker_pid: int | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def arm(self, rule: KillRule, worker_pid: int) -> KillRule:
        with self._lock:
            self.rule, self.worker_pid = rule, worker_pid
        return rule

    def _should_kill(self, method: str, path: str, body: bytes, when: str) -> bool:
        with self._lock:
            rule = self.rule
            if rule is None or rule.fired.is_set() or rule.when != when or not rule.matches(method, path, body):
                return False
            rule.seen += 1
            if rule.seen < rule.nth:
                return False
            rule.fired.set()
            pid = self.worker_pid
        kill_process_tree(pid)
        return True

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                if proxy._should_kill(self.command, self.path, body, "before"):
                    self.close_connection = True
                    return
                upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    payload = answer.read()
                except OSError:
                    self.send_error(502, "MLflow is not reachable behind the proxy")
                    return
                finally:
                    upstream.close()
                if proxy._should_kill(self.command, self.path, body, "after"):
                    self.close_connection = True
                    return
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward  # noqa: N815 - http.server names

        return Handler

    @contextmanager
    def running(self) -> Iterator[FaultProxy]:
        thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)
