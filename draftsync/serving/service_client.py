"""The serving service's admin API, from the caller's side: serve a pair at a deployment, read what is served.

The service (`draftsync serving run`) owns the servers and routers, so they outlive the flow run that asked for them,
and a flow on any work pool (a CPU worker's fallback too) can change what is served. Every call carries the service's
token as `Authorization: Bearer <token>`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import httpx

from draftsync.errors import DraftsyncError
from draftsync.serving.servers import PairSwitch

# A candidate vLLM loads its weights, warms up and is benchmarked before the switch answers.
SERVE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ServiceRequest:
    """The pair a deployment should serve: registry versions (the service downloads them itself), the gamma, the
    method vLLM drafts with and its per-batch-size schedule; `drafter_version` None: speculation off."""

    target_version: int
    drafter_version: int | None
    gamma: int
    method: str | None
    schedule: list | None = None
    draft_sampling: str | None = None  # vLLM's draft_sample_method (None: the deployment's, else vLLM's default)


class ServingServiceClient:
    def __init__(self, url: str, token: str, timeout: float = SERVE_TIMEOUT_S):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DraftsyncError(
                f"DRAFTSYNC_SERVING_URL {url!r} is not an http(s) URL",
                "set it to the serving service's admin address, e.g. http://serving:8100",
            )
        self.url = url.rstrip("/")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            answer = httpx.request(
                method, self.url + path, headers=self.headers, timeout=httpx.Timeout(self.timeout, connect=10), **kwargs
            )
        except httpx.TransportError as error:
            raise DraftsyncError(
                f"the serving service at {self.url} cannot be reached ({type(error).__name__}: {error})",
                "start it (`draftsync serving run`, the stack's `serving` service) or correct DRAFTSYNC_SERVING_URL",
            ) from error
        body = _json(answer)
        if answer.status_code in (401, 403):
            raise DraftsyncError(
                f"the serving service at {self.url} refused the call ({answer.status_code}: {body.get('error')})",
                "give this flow run the service's own DRAFTSYNC_SERVING_TOKEN",
            )
        if answer.status_code != 200:
            said = body.get("error", answer.text[:300])
            raise DraftsyncError(
                f"the serving service at {self.url} answered {answer.status_code}: {said}",
                body.get("fix") or "see the serving service's log",
            )
        return body

    def serve(self, deployment: str, request: ServiceRequest) -> PairSwitch:
        """Serve the pair at the deployment (candidate, checks, benchmark, switch); returns once traffic moved, with
        the router's endpoint as this caller reaches it."""
        body = self._call("PUT", f"/draftsync/deployments/{deployment}/pair", json=asdict(request))
        switched = body["switch"]
        return PairSwitch(**{**switched, "endpoint": self.router_endpoint(body["router_port"])})

    def captured(self, deployment: str, after_id: int = 0) -> list[dict]:
        """The requests the deployment's router captured after row `after_id`, oldest first."""
        return self._call("GET", f"/draftsync/deployments/{deployment}/traffic", params={"after_id": after_id})["rows"]

    def deployments(self) -> dict:
        """What each deployment serves now, as the service records it."""
        return self._call("GET", "/draftsync/deployments")["deployments"]

    def router_endpoint(self, port: int) -> str:
        """A deployment's router on the service's host: where clients and the scrape reach it."""
        return f"{self.scheme}://{self.host}:{int(port)}"


def _json(answer: httpx.Response) -> dict:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
