"""The stable front door of a deployment: a small reverse proxy whose upstream can be switched atomically.

A rollout starts the candidate server on a new port, checks it, and only then points the router at it;
clients keep one address throughout. Every request is bound to the upstream that is current when it
arrives, and counted in flight there until its answer is sent, so the rollout stops the old server only
once nothing is left on it: no request is dropped by a swap.

- `/v1/*` (GET, POST) and `/metrics` are forwarded to the current upstream; status and body pass through.
- `/health` is 200 only when an upstream is set and answers its own `/health`; `/draftsync/live` is 200
  as soon as the router listens (what a launcher waits for before any upstream is up).
- `GET|PUT /draftsync/upstream` reads or switches the upstream; both need the router's token as
  `Authorization: Bearer <token>` (from `--token-file`, else the DRAFTSYNC_ROUTER_TOKEN variable).
  The token never appears in argv or in the log.
- When the upstream cannot be reached the client gets a 502 in OpenAI's error shape, naming the upstream.

Run: python -m draftsync.serving.router --host 127.0.0.1 --port P [--upstream URL] --token-file FILE
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import secrets
import sys
import time
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from draftsync.errors import DraftsyncError
from draftsync.serving.traffic_capture import CaptureConfig, TrafficCapture

TOKEN_ENV = "DRAFTSYNC_ROUTER_TOKEN"
ADMIN_PATH = "/draftsync/upstream"
CAPTURE_PATH = "/draftsync/capture"
LIVE_PATH = "/draftsync/live"  # 200 once the router listens, upstream or not: what a launcher waits for
# Shorter than uvicorn's (and so vLLM's) 5 s keep-alive: a pooled connection is never reused just as the
# upstream closes it, a race that would otherwise surface as a rare dropped request.
UPSTREAM_KEEPALIVE_SECONDS = 2.0
# Clients hold their connections to the router longer than that; keep them open so they need not reconnect.
CLIENT_KEEPALIVE_SECONDS = 30
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the proxy recomputes; never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
    }
)


def router_command(
    host: str, port: int, upstream: str | None, token_file: Path | str | None, capture: CaptureConfig | None = None
) -> list[str]:
    """The argument list that runs the router with the current interpreter (the token stays in its file)."""
    argv = [sys.executable, "-m", "draftsync.serving.router", "--host", host, "--port", str(int(port))]
    if upstream is not None:
        argv += ["--upstream", normalise_upstream(upstream)]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    if capture is not None:
        argv += ["--capture-file", str(capture.path), "--capture-deployment", capture.deployment]
        argv += ["--capture-rate", f"{capture.rate:g}", "--capture-max-rows", str(capture.max_rows)]
        argv += ["--capture-retention-days", f"{capture.retention_days:g}"]
        argv += ["--capture-redact", capture.redact] if capture.redact else []
        argv += ["--capture-responses"] if capture.keep_responses else []
    return argv


def normalise_upstream(url: str) -> str:
    """An upstream base URL: http(s), a host and port, no trailing slash, no query."""
    parts = urlsplit(url.strip()) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise DraftsyncError(
            f"upstream URL {url!r} is not an http(s) base URL",
            "give it as http://HOST:PORT (the server's root, where /health and /v1 live)",
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as error:
        raise DraftsyncError(f"upstream URL {url!r} has a bad port ({error})", "give it as http://HOST:PORT") from error
    return url.strip().rstrip("/")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token_file(path: Path | str, token: str | None = None) -> str:
    """Write a token readable by its owner only and return it (a fresh random one unless given)."""
    token = token or new_token()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)  # also when the file already existed with wider permissions
    return token


def read_token(token_file: Path | str | None) -> str:
    """The admin token: from the file when one is named, else from DRAFTSYNC_ROUTER_TOKEN."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as error:
            raise DraftsyncError(
                f"router token file {token_file} cannot be read ({error.strerror})",
                "create it with draftsync.serving.router.write_token_file, or point --token-file at it",
            ) from error
        if not token:
            raise DraftsyncError(f"router token file {token_file} is empty", "write a token into it")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise DraftsyncError(
            "the router has no admin token", f"pass --token-file FILE or set {TOKEN_ENV}; the upstream switch needs it"
        )
    return token


class UpstreamSwitch:
    """The current upstream and the requests in flight on each one.

    Everything runs on the one event loop, and picking an upstream and counting the request on it happen
    with no `await` in between: once `switch` has set the new URL, no request can still be added to the
    old one, so its in-flight count only falls.
    """

    def __init__(self, upstream: str | None):
        self.url = upstream
        self.previous: str | None = None
        self.in_flight: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()  # requests the upstream answered (any status)
        self.switched_at: float | None = None
        self.lock = asyncio.Lock()  # one switch at a time, so `previous` is the one really replaced

    def acquire(self) -> str | None:
        url = self.url
        if url is not None:
            self.in_flight[url] += 1
        return url

    def release(self, url: str) -> None:
        self.in_flight[url] -= 1
        if self.in_flight[url] <= 0:
            del self.in_flight[url]

    def state(self) -> dict[str, Any]:
        in_flight = {url: count for url, count in self.in_flight.items() if count > 0}
        if self.url is not None:
            in_flight.setdefault(self.url, 0)
        return {
            "url": self.url,
            "previous": self.previous,
            "in_flight": in_flight,
            "answered": dict(self.answered),
            "switched_at": self.switched_at,
        }


def _openai_error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def _unreachable(url: str, error: httpx.TransportError) -> JSONResponse:
    if isinstance(error, httpx.TimeoutException):
        return _openai_error(
            504, f"upstream {url} did not answer in time ({type(error).__name__})", "GatewayTimeoutError"
        )
    if isinstance(error, httpx.ConnectError):
        reason = "could not be connected to (is a server running there?)"
    else:
        reason = "dropped the connection before answering"
    detail = str(error) or type(error).__name__
    return _openai_error(502, f"upstream {url} {reason}: {detail}", "BadGatewayError")


def bearer_refusal(request: Request, expected_token: bytes, owner: str) -> Response | None:
    """None when the request's bearer token is `owner`'s (compared in constant time), else the 401/403 to answer."""
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return JSONResponse(
            {"error": f"this endpoint needs the {owner}'s token as `Authorization: Bearer <token>`"},
            401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(presented.strip().encode(), expected_token):
        return JSONResponse({"error": f"the token is not the {owner}'s token"}, 403)
    return None


def create_app(
    upstream: str | None,
    token: str,
    upstream_timeout: float = 600.0,
    health_timeout: float = 5.0,
    capture: TrafficCapture | None = None,
) -> Starlette:
    """The router app: /health, /metrics and /v1/... forwarded to the upstream it switches to, and its admin routes.
    Long: the app's routes are closures over the one upstream switch, clients and capture it is built with."""
    switch = UpstreamSwitch(normalise_upstream(upstream) if upstream is not None else None)
    expected_token = token.encode()
    timeout = httpx.Timeout(upstream_timeout, connect=min(10.0, upstream_timeout))
    clients: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette):
        clients["upstream"] = httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(keepalive_expiry=UPSTREAM_KEEPALIVE_SECONDS), follow_redirects=False
        )
        try:
            yield
        finally:
            await clients.pop("upstream").aclose()

    def authorised(request: Request) -> Response | None:
        return bearer_refusal(request, expected_token, "router")

    async def send(method: str, url: str, path: str, body: bytes, headers: list) -> httpx.Response:
        return await clients["upstream"].request(method, url + path, content=body, headers=headers)

    async def forward(request: Request) -> Response:
        url = switch.acquire()
        if url is None:
            return _openai_error(503, "the router has no upstream yet: switch one in first", "ServiceUnavailableError")
        try:
            body = await request.body()
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
            path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            try:
                answer = await send(request.method, url, path, body, headers)
            except httpx.ConnectError as error:
                if switch.url in (None, url):
                    return _unreachable(url, error)
                # Nothing reached the replaced upstream, so the current one can take the request instead.
                switch.release(url)
                current = switch.acquire()
                assert current is not None, "switch.url was checked above, with no await since"
                url = current
                answer = await send(request.method, url, path, body, headers)
        except httpx.TransportError as error:
            return _unreachable(url, error)
        finally:
            switch.release(url)
        switch.answered[url] += 1
        if capture is not None and request.method == "POST":
            capture.offer(request.url.path, request.headers, body, answer.status_code, answer.content)
        response = Response(answer.content, answer.status_code)
        for key, value in answer.headers.multi_items():
            if key.lower() not in HOP_BY_HOP and key.lower() not in ("date", "server"):
                response.headers.append(key, value)
        return response

    async def health(_: Request) -> Response:
        url = switch.url
        if url is None:
            return JSONResponse({"status": "no upstream", "upstream": None}, 503)
        try:
            answer = await clients["upstream"].get(url + "/health", timeout=health_timeout)
        except httpx.TransportError as error:
            return JSONResponse({"status": "upstream unreachable", "upstream": url, "detail": str(error)}, 503)
        if answer.status_code != 200:
            return JSONResponse({"status": f"upstream /health answered {answer.status_code}", "upstream": url}, 503)
        return JSONResponse({"status": "ok", "upstream": url})

    async def live(_: Request) -> Response:
        return JSONResponse({"status": "listening"})

    async def read_upstream(request: Request) -> Response:
        refusal = authorised(request)
        return refusal or JSONResponse(switch.state())

    async def read_capture(request: Request) -> Response:
        """What traffic capture kept and dropped, and why (its counts since the router started)."""
        refusal = authorised(request)
        return refusal or JSONResponse({"enabled": capture is not None, **(capture.stats() if capture else {})})

    async def put_upstream(request: Request) -> Response:
        refusal = authorised(request)
        if refusal is not None:
            return refusal
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not valid JSON"}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            return JSONResponse({"error": 'the body must be {"url": "http://HOST:PORT"}'}, 400)
        check = body.get("check_health", True)
        if not isinstance(check, bool):
            return JSONResponse({"error": "`check_health` must be true or false"}, 400)
        try:
            new_url = normalise_upstream(body["url"])
        except DraftsyncError as error:
            return JSONResponse({"error": error.what, "fix": error.fix}, 400)
        async with switch.lock:
            if check:
                try:
                    answer = await clients["upstream"].get(new_url + "/health", timeout=health_timeout)
                    healthy, detail = answer.status_code == 200, f"answered {answer.status_code}"
                except httpx.TransportError as error:
                    healthy, detail = False, f"is unreachable ({str(error) or type(error).__name__})"
                if not healthy:
                    return JSONResponse(
                        {"error": f"upstream {new_url} /health {detail}; the upstream stays {switch.url}"}, 409
                    )
            old_url = switch.url
            if new_url != old_url:
                switch.previous, switch.url, switch.switched_at = old_url, new_url, time.time()
                print(f"upstream switched: {old_url} -> {new_url}", flush=True)
            state = switch.state()
        left = state["in_flight"].get(old_url, 0) if old_url not in (None, new_url) else 0
        return JSONResponse({**state, "replaced": old_url, "replaced_in_flight": left})

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", forward),
            Route("/v1/{rest:path}", forward, methods=["GET", "POST"]),
            Route(LIVE_PATH, live),
            Route(ADMIN_PATH, read_upstream, methods=["GET"]),
            Route(ADMIN_PATH, put_upstream, methods=["PUT"]),
            Route(CAPTURE_PATH, read_capture, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


class RouterClient:
    """What a rollout uses to steer a running router."""

    def __init__(self, url: str, token: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout

    def _call(self, method: str, body: dict | None = None) -> dict:
        try:
            response = httpx.request(
                method, self.url + ADMIN_PATH, json=body, headers=self._headers, timeout=self.timeout
            )
        except httpx.TransportError as error:
            raise DraftsyncError(
                f"router at {self.url} is not reachable ({str(error) or type(error).__name__})",
                "check that the router process runs and listens on that address",
            ) from error
        if response.status_code in (401, 403):
            raise DraftsyncError(
                f"router at {self.url} refused the token (HTTP {response.status_code})",
                "use the token the router was started with (its --token-file or DRAFTSYNC_ROUTER_TOKEN)",
            )
        if response.status_code != 200:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise DraftsyncError(
                f"router at {self.url} refused {method} {ADMIN_PATH} (HTTP {response.status_code}): {message}",
                "start the new upstream and wait until its /health answers 200 before switching to it"
                if response.status_code == 409
                else 'send a body of the form {"url": "http://HOST:PORT"}',
            )
        return response.json()

    def state(self) -> dict:
        """{url, previous, in_flight: {url: n}, answered: {url: n}, switched_at}."""
        return self._call("GET")

    def switch(self, new_url: str, check_health: bool = True) -> dict:
        """Point the router at `new_url`; on return every new request goes there.

        The answer also says which upstream was replaced and how many of its requests are still in flight.
        """
        return self._call("PUT", {"url": normalise_upstream(new_url), "check_health": check_health})

    def wait_drained(self, url: str, timeout: float, poll_seconds: float = 0.1) -> dict:
        """Block until no request is in flight on `url` (a replaced upstream); returns the router's state."""
        url = normalise_upstream(url)
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if state["url"] == url:
                raise DraftsyncError(
                    f"{url} is the router's current upstream, so it never drains",
                    "switch the router to the new upstream first, then wait for the old one to drain",
                )
            left = state["in_flight"].get(url, 0)
            if left == 0:
                return state
            if time.monotonic() > deadline:
                raise DraftsyncError(
                    f"{left} request(s) still in flight on {url} after {timeout:.0f} s",
                    "wait longer (long generations take a while), or stop it anyway and accept those failures",
                )
            time.sleep(poll_seconds)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m draftsync.serving.router",
        description="A deployment's stable address: forwards /v1 and /metrics to an upstream that can be swapped.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--upstream", help="the first upstream, http://HOST:PORT (none: switch one in later)")
    parser.add_argument("--token-file", type=Path, help=f"file holding the admin token (default: ${TOKEN_ENV})")
    parser.add_argument("--upstream-timeout", type=float, default=600.0, help="seconds an upstream may take to answer")
    parser.add_argument("--health-timeout", type=float, default=5.0, help="seconds an upstream /health may take")
    parser.add_argument("--capture-file", type=Path, help="capture a sample of the traffic into this SQLite file")
    parser.add_argument("--capture-deployment", default="deployment", help="the deployment the captures belong to")
    parser.add_argument("--capture-rate", type=float, default=0.1, help="share of requests captured")
    parser.add_argument("--capture-max-rows", type=int, default=10_000, help="rows kept; the oldest go first")
    parser.add_argument("--capture-retention-days", type=float, default=14.0, help="days a captured row is kept")
    parser.add_argument("--capture-redact", help="package.module:function applied to each record before it is kept")
    parser.add_argument("--capture-responses", action="store_true", help="keep the responses too")
    args = parser.parse_args(argv)
    if args.upstream_timeout <= 0 or args.health_timeout <= 0:
        parser.error("timeouts must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        token = read_token(args.token_file)
        upstream = normalise_upstream(args.upstream) if args.upstream is not None else None
    except DraftsyncError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    import uvicorn

    capture = None
    if args.capture_file is not None:
        try:
            capture = TrafficCapture(
                CaptureConfig(
                    path=args.capture_file,
                    deployment=args.capture_deployment,
                    rate=args.capture_rate,
                    max_rows=args.capture_max_rows,
                    retention_days=args.capture_retention_days,
                    redact=args.capture_redact,
                    keep_responses=args.capture_responses,
                )
            )
        except (ImportError, AttributeError, ValueError) as error:  # a redact hook that cannot be loaded
            print(f"error: traffic capture cannot start: {error}", file=sys.stderr, flush=True)
            return 2
    app = create_app(upstream, token, args.upstream_timeout, args.health_timeout, capture)
    print(f"routing http://{args.host}:{args.port} -> {upstream or '(no upstream yet)'}", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=CLIENT_KEEPALIVE_SECONDS,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
