"""Serving deployments: which target (and the alias it follows) is served where, and how.

Deployments are declared in a YAML file and read with `load_deployments(path)`; every problem in the
file comes back as one error naming the file, the deployment and the field. Example:

```yaml
deployments:
  - name: chat                      # letters, digits, '.', '_', '-'; unique in the file
    target_name: llama-chat         # the registered target model
    target_alias: production        # the target alias this deployment follows (default: production)
    task_mix: {code: 0.7, math: 0.3}  # traffic shares for smoke and benchmark requests (code, math, prose)
    temperature: 0.0
    tpot_target_ms: 25              # optional: the time per output token to stay under, in ms
    launch: vllm                    # vllm: draftsync runs `vllm serve` on a GPU worker
    host: 0.0.0.0                   # the stable address clients use
    port: 8000
    tensor_parallel_size: 2
    extra_vllm_args: ["--max-model-len", "8192", "--gpu-memory-utilization", "0.90"]
    fallback_threshold: 0.6         # live acceptance under this over the window -> speculation off (null: no guard)
    fallback_window_minutes: 30
  - name: demo
    target_name: tiny-llm
    launch: reference               # the CPU reference server
    port: 8100
  - name: chat-k8s
    target_name: llama-chat
    launch: external                # an orchestrator runs vLLM with the arguments draftsync writes
    endpoint: http://chat.serving.svc:8000   # the URL draftsync watches
    host: 0.0.0.0                   # host and port are written into the rendered vLLM arguments
    port: 8000
```

`extra_vllm_args` may not set what draftsync sets itself: the model, `--speculative-config`, `--host`,
`--port`, `--served-model-name` and `--tensor-parallel-size` (`-tp`), nor `--trust-remote-code` (only
DRAFTSYNC_TRUST_REMOTE_CODE turns that on). The file names no model paths: the target and drafter come from the
registry, and their directories are checked against the model roots at launch.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from draftsync.errors import DraftsyncError
from draftsync.profiles import DraftSampling
from draftsync.serving.vllm_args import SpeculationSpec, VllmLaunch, check_extra_vllm_args, render_vllm_command
from draftsync.speculative.data.corpora import TASKS

if TYPE_CHECKING:
    from draftsync.serving.vllm_engine import VllmEngine

LaunchMode = Literal["reference", "vllm", "external"]


VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default `--gpu-memory-utilization`


def _invalid(message: str, fix: str) -> PydanticCustomError:
    """A validation error that carries its fix through pydantic to the loader's message."""
    return PydanticCustomError("draftsync", message, {"fix": fix})


def _gpu_memory_utilization(args: Sequence[str]) -> str | None:
    """The value of vLLM's --gpu-memory-utilization among `args`, as written (None: not given)."""
    for index, arg in enumerate(args):
        if arg.startswith("--gpu-memory-utilization="):
            return arg.split("=", 1)[1]
        if arg == "--gpu-memory-utilization" and index + 1 < len(args):
            return args[index + 1]
    return None


class TrafficCaptureSettings(BaseModel):
    """A deployment's `capture` section: a bounded sample of its traffic, kept for a retrain on what it serves."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(0.1, gt=0.0, le=1.0)  # share of requests kept
    max_rows: int = Field(10_000, ge=1)  # the oldest rows go first
    retention_days: float = Field(14.0, gt=0.0)
    redact: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")  # module:function
    keep_responses: bool = False


class ServingDeployment(BaseModel):
    """One endpoint serving a target with its validated drafter (or with speculation off)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    target_name: str = Field(min_length=1)
    target_alias: str = Field("production", pattern=r"^[A-Za-z0-9_-]+$")  # the deployment follows this alias
    task_mix: dict[str, float] = Field(default_factory=lambda: {"code": 0.5, "math": 0.5})
    temperature: float = Field(0.0, ge=0.0)
    tpot_target_ms: float | None = Field(None, gt=0.0)
    launch: LaunchMode = "reference"
    host: str = Field("127.0.0.1", pattern=r"^[A-Za-z0-9._-]+$")  # the stable address clients use
    port: int = Field(0, ge=0, le=65535)  # 0: pick a free port at launch
    endpoint: str | None = Field(None, validate_default=True)  # launch external: the URL draftsync watches
    tensor_parallel_size: int = Field(1, ge=1)  # GPUs the target is served on
    gpu_memory_gb: float = Field(80.0, gt=0.0)  # memory of one of them (the recommendation's memory check)
    extra_vllm_args: list[str] = Field(default_factory=list)
    # vLLM's draft_sample_method for drafters with a checkpoint: None keeps vLLM's (greedy drafts, each accepted with
    # the target's probability of it); "probabilistic" samples drafts and tests the probability ratio, which accepts
    # more at T > 0 (docs/VALIDATION.md) for the draft probabilities' memory. Validate with the same setting.
    draft_sampling: DraftSampling | None = None
    # The acceptance guard (vLLM has no acceptance threshold): pooled live acceptance over the window below
    # the threshold, with at least `fallback_min_draft_tokens` drafted -> relaunch with speculation off.
    fallback_threshold: float | None = Field(0.60, ge=0.0, le=1.0)  # the production guide's 0.6; None: no guard
    fallback_window_minutes: int = Field(30, ge=1)
    fallback_min_draft_tokens: int = Field(200, ge=1)
    # Read the counters from a Prometheus server's HTTP API instead of the endpoint's /metrics (for teams that
    # already scrape vLLM with Prometheus); the labels select this deployment's series.
    prometheus_url: str | None = None
    prometheus_labels: dict[str, str] = Field(default_factory=dict)
    # Traffic capture at the router (serving/traffic_capture.py): off unless this section is given.
    capture: TrafficCaptureSettings | None = None

    @field_validator("task_mix")
    @classmethod
    def _known_tasks_with_shares(cls, mix: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(mix) - set(TASKS))
        if unknown:
            raise _invalid(
                f"tasks {unknown} are not among {list(TASKS)}",
                f"use tasks among {', '.join(TASKS)} (the prompt sets draftsync has)",
            )
        if any(share < 0 for share in mix.values()) or not any(share > 0 for share in mix.values()):
            raise _invalid(
                f"shares {mix} are not >= 0 with at least one above 0",
                "give each task a share >= 0, e.g. {code: 0.5, math: 0.5}",
            )
        return mix

    @field_validator("endpoint")
    @classmethod
    def _endpoint_only_for_external(cls, endpoint: str | None, info: ValidationInfo) -> str | None:
        launch = info.data.get("launch")
        if launch is None:  # launch itself is invalid and reported on its own
            return endpoint
        if launch != "external":
            if endpoint is not None:
                raise _invalid(
                    f"endpoint is set but launch is {launch!r}",
                    "remove endpoint: draftsync starts this deployment's servers itself and knows "
                    "where they listen; endpoint is for launch: external",
                )
            return None
        if endpoint is None:
            raise _invalid(
                "launch external needs the endpoint draftsync watches",
                "add endpoint: http://HOST:PORT (the URL the orchestrator serves the pair on)",
            )
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _invalid(f"endpoint {endpoint!r} is not an http(s) URL", "write it as http://HOST:PORT")
        return endpoint.rstrip("/")

    @field_validator("extra_vllm_args")
    @classmethod
    def _no_flags_draftsync_sets(cls, args: list[str]) -> list[str]:
        try:
            checked = check_extra_vllm_args(args)
        except DraftsyncError as error:
            raise _invalid(error.what, error.fix) from None
        given = _gpu_memory_utilization(checked)
        if given is not None:  # the plan reads it for the GPU memory this deployment holds
            try:
                fraction = float(given)
            except ValueError:
                fraction = math.nan
            if not 0.0 < fraction <= 1.0:
                raise _invalid(
                    f"--gpu-memory-utilization {given!r} is not a fraction of a GPU's memory",
                    "give a number above 0 and at most 1, e.g. --gpu-memory-utilization 0.5",
                )
        return checked

    def gpu_memory_fraction(self) -> float | None:
        """The fraction of each of its GPUs this deployment's vLLM holds on the worker (vLLM's 0.9 unless its args
        say); None for a deployment that holds no GPU of this worker (the reference server, an external one)."""
        if self.launch != "vllm":
            return None
        given = _gpu_memory_utilization(self.extra_vllm_args)
        return float(given) if given is not None else VLLM_GPU_MEMORY_UTILIZATION

    def vllm_launch(
        self,
        target_dir: Path | str,
        drafter_dir: Path | str | None,
        method: str | None,
        gamma: int,
        *,
        schedule: Sequence[Sequence[int]] | None = None,
        port: int | None = None,
        engine: VllmEngine | None = None,
        draft_sampling: str | None = None,
    ) -> VllmLaunch:
        """The `vllm serve` launch for this deployment's pair; `port` overrides the deployment's (a candidate
        starts beside the instance it replaces). With `engine`, the argv is the one that starts that installation
        (its interpreter or command, and its CPU settings); without, the `vllm serve` of a GPU worker's image.
        `draft_sampling`: the pair's draft sample method (rollout: the deployment's, else validation's choice); None
        renders the deployment's.

        Both directories must lie inside the model roots (model_paths.py): this is the launch draftsync starts or
        hands to an orchestrator. They are rendered resolved, so vLLM opens what was checked."""
        from draftsync.model_paths import confined_model_path

        target_dir = confined_model_path(target_dir, "target checkpoint")
        if drafter_dir is not None:
            drafter_dir = confined_model_path(drafter_dir, "drafter checkpoint")
        speculation = SpeculationSpec(
            method=method,
            model=drafter_dir,
            num_speculative_tokens=gamma,
            schedule=schedule,
            # ngram has no drafts to sample; `draft_sampling` (the pair's) stands in for the deployment's where given
            draft_sample_method=(draft_sampling or self.draft_sampling) if drafter_dir is not None else None,
        )
        launch = render_vllm_command(
            target_dir,
            port=self.port if port is None else port,
            served_model_name=self.name,
            speculation=speculation,
            host=self.host,
            tensor_parallel_size=self.tensor_parallel_size,
            extra_args=self.extra_vllm_args,
        )
        if engine is None:
            return launch
        return VllmLaunch(argv=engine.server_argv(launch.argv), speculative_config=launch.speculative_config)


_FIELDS = tuple(ServingDeployment.model_fields)


def load_deployments(path: Path | str) -> list[ServingDeployment]:
    """The deployments declared in a YAML file, or one DraftsyncError listing every problem in it."""
    from draftsync.user_files import read_yaml

    path = Path(path)
    data = read_yaml(
        path,
        "deployments file",
        "declare deployments in YAML there, or point DRAFTSYNC_DEPLOYMENTS_FILE at yours (the format: docs/SERVING.md)",
    )
    entries = _entries(path, data)
    problems: list[tuple[str, str]] = []
    deployments: list[ServingDeployment] = []
    for index, entry in enumerate(entries, start=1):
        label = _label(entry, index)
        if not isinstance(entry, dict):
            problems.append(
                (
                    f"deployment {label} is {type(entry).__name__} {entry!r}, not a mapping",
                    "write each deployment as a mapping of fields (name: ..., target_name: ...)",
                )
            )
            continue
        try:
            deployments.append(ServingDeployment.model_validate(entry))
        except ValidationError as error:
            problems += [_describe(label, item) for item in error.errors()]
    problems += _duplicate_names(entries)
    if len(problems) == 1:
        message, fix = problems[0]
        raise DraftsyncError(f"deployments file {path}: {message}", fix)
    if problems:
        lines = "\n".join(f"  - {message}\n      fix: {fix}" for message, fix in problems)
        raise DraftsyncError(
            f"deployments file {path} has {len(problems)} problems:\n{lines}",
            "fix each problem as its line says, then load the file again",
        )
    return deployments


def find_deployment(deployments: Sequence[ServingDeployment], name: str) -> ServingDeployment:
    """The deployment called `name`, or an error listing the names there are."""
    for deployment in deployments:
        if deployment.name == name:
            return deployment
    known = sorted(deployment.name for deployment in deployments)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise DraftsyncError(
        f"no deployment is called {name!r}{hint}; known: {', '.join(known) if known else 'none'}",
        "use one of the known names, or declare the deployment in the deployments file",
    )


def _entries(path: Path, data: Any) -> list[Any]:
    shape = "a top-level `deployments:` list, e.g.\ndeployments:\n  - name: chat\n    target_name: llama-chat"
    if data is None:
        raise DraftsyncError(f"deployments file {path} is empty", f"declare the deployments under {shape}")
    if not isinstance(data, dict) or "deployments" not in data:
        raise DraftsyncError(f"deployments file {path} has no top-level `deployments` key", f"write {shape}")
    unknown = sorted(str(key) for key in data if key != "deployments")
    if unknown:
        raise DraftsyncError(
            f"deployments file {path} has unknown top-level keys {unknown}",
            "remove them: only `deployments` is read at the top level",
        )
    entries = data["deployments"]
    if not isinstance(entries, list) or not entries:
        raise DraftsyncError(
            f"deployments file {path}: `deployments` is {entries!r}, not a non-empty list", f"write {shape}"
        )
    return entries


def _label(entry: Any, index: int) -> str:
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"{name!r} (entry {index})" if isinstance(name, str) and name else f"entry {index} (no valid name)"


def _describe(label: str, item: ErrorDetails) -> tuple[str, str]:
    """One pydantic error as (message naming the deployment and field, fix)."""
    field = ".".join(str(part) for part in item["loc"]) or "(deployment)"
    top = str(item["loc"][0]) if item["loc"] else ""
    kind = item["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(top, _FIELDS, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"deployment {label}: field {field!r} is not a deployment field{guess}",
            f"remove {field!r} or correct its spelling; deployment fields are {', '.join(_FIELDS)}",
        )
    if kind == "missing":
        return f"deployment {label}: field {field!r} is required", f"add {field!r} to deployment {label}"
    message = item["msg"]
    fix = (item.get("ctx") or {}).get("fix") or f"correct {field!r} of deployment {label}"
    shown = item.get("input")
    too_long = isinstance(shown, (dict, list)) and len(repr(shown)) > 80
    got = "" if kind == "draftsync" or too_long else f" (got {shown!r})"
    if isinstance(shown, float) and not math.isfinite(shown):
        message = "must be a finite number"
    return f"deployment {label}: field {field!r}: {message}{got}", fix


def _duplicate_names(entries: list[Any]) -> list[tuple[str, str]]:
    seen: dict[str, list[int]] = {}
    for index, entry in enumerate(entries, start=1):
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str):
            seen.setdefault(name, []).append(index)
    return [
        (
            f"deployment {name!r}: field 'name' is declared {len(where)} times (entries {', '.join(map(str, where))})",
            "give each deployment its own name",
        )
        for name, where in seen.items()
        if len(where) > 1
    ]
