"""Settings (env prefix DRAFTSYNC_) and the embedded defaults that live under the work dir.

Three places, the first that has a variable wins: the environment, the env file DRAFTSYNC_ENV_FILE names (what a
work pool mounts into each flow run: docker and kubernetes workers do not pass their own environment on), the work
dir's settings.env.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, DotEnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

# The settings a work dir was set up with (`draftsync demo` writes its thresholds there), read by every later command
# on that work dir; an environment variable wins over the file.
WORKDIR_SETTINGS_FILE = "settings.env"
# The variable naming an env file read like the environment: its DRAFTSYNC_ settings, and the libraries' own variables
# (MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME, PREFECT_API_URL, ...), which apply_environment exports.
ENV_FILE_VARIABLE = "DRAFTSYNC_ENV_FILE"
DEFAULT_WORKDIR = Path(".draftsync")
# The GPU counts a sync may ask the GPU work pool for: drafter-sync has a trigger for each
# (flows/prefect_deployments.py).
GPU_COUNTS = (1, 2, 4, 8)


class Settings(BaseSettings):
    """Everything configurable; standard MLFLOW_TRACKING_URI and PREFECT_* variables win when set."""

    model_config = SettingsConfigDict(env_prefix="DRAFTSYNC_", extra="ignore")

    workdir: Path = DEFAULT_WORKDIR
    debug: bool = False  # tracebacks on the terminal for expected errors too (`draftsync --debug`)
    monitor_db_url: str | None = None  # default: SQLite file under the work dir

    smtp_host: str | None = None
    smtp_port: int | None = Field(None, ge=1, le=65535)
    smtp_user: str | None = None
    smtp_password: SecretStr | None = None
    smtp_password_block: str | None = None  # a Prefect Secret block holding the password (read at send time)
    smtp_security: Literal["none", "starttls", "ssl"] = "none"
    alert_from: str = "draftsync@localhost"
    alert_to: str = "ml-platform@localhost"  # comma-separated

    # acceptance lines: shares of drafted tokens, so 0..1 and finite
    mismatch_threshold: float = Field(0.60, ge=0.0, le=1.0, allow_inf_nan=False)  # below: mismatch suspected
    stale_threshold: float = Field(0.50, ge=0.0, le=1.0, allow_inf_nan=False)  # sustained below: fallback, retrain
    trust_remote_code: bool = False
    # Directories model checkpoints may be read from besides the work dir (comma- or os.pathsep-separated).
    # Registry downloads and everything `draftsync demo` builds live under the work dir, which is always a root.
    model_roots: str = ""
    # Where a target logged by reference (a hub repository and revision) is looked for besides the Hugging Face
    # cache: directories holding `<org>/<name>` local-dir downloads or a hub cache's `models--org--name` folders.
    model_mirrors: str = ""
    hub_downloads: bool = False  # let a worker download a by-reference target's weights from the hub
    deployments_file: Path | None = None  # the deployments YAML; default: <workdir>/deployments.yaml
    # The most a sync's dataset may take on disk; None: the free space of the work dir's disk.
    disk_budget_gb: float | None = Field(None, gt=0, allow_inf_nan=False)

    # The vLLM that `launch: vllm` starts (serving/vllm_engine.py): a Python interpreter or venv of a vLLM
    # installation, or its `vllm` command; default: .venv-vllm (`make vllm`), else `vllm` on PATH.
    vllm: str | None = None
    vllm_device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when an NVIDIA device is present
    vllm_cpu_kvcache_gb: float = Field(1.0, gt=0, allow_inf_nan=False)  # VLLM_CPU_KVCACHE_SPACE per engine on a CPU
    vllm_cpu_dtype: str = "float32"  # on a CPU; a deployment's --dtype in extra_vllm_args wins

    # Production operation (`draftsync serve`, the webhook receiver).
    sync_profile: str = "demo"  # the profile event-started syncs use: production on GPU workers
    # A node of the draftsync-gpu work pool: its GPUs (1, 2, 4 or 8) and each one's memory. A sync request plans on
    # it and asks the pool for as many GPUs as that plan uses (prefect.yaml's sync triggers, one per count).
    gpu_pool_gpus: int = 1
    gpu_pool_gpu_memory_gb: float = Field(80.0, gt=0, allow_inf_nan=False)
    targets: str = ""  # comma-separated model names to sync besides versions tagged draftsync.kind=target
    webhook_secret: SecretStr | None = None
    webhook_secret_block: str | None = None  # a Prefect Secret block holding the webhook secret
    webhook_url: str | None = None  # where MLflow delivers: `webhooks register` without --url registers this one
    webhook_max_age_seconds: int = Field(300, ge=1)  # older (or further in the future) deliveries are refused
    webhook_max_body_bytes: int = Field(1 << 20, ge=1)
    report_timezone: str = "UTC"  # the weekly report's cron runs in this zone
    # Where people open the UIs (links in e-mails and artifacts): set them where the tracking URI or PREFECT_API_URL
    # is an address inside the stack (http://mlflow:5000). Unset: the tracking server itself (or `mlflow ui` on
    # 127.0.0.1:5000 for an embedded registry), and PREFECT_UI_URL or the API URL without its /api.
    mlflow_ui_url: str | None = None
    prefect_ui_url: str | None = None
    # The serving service (`draftsync serving run`): it owns vLLM and the routers, so serving outlives a flow run and a
    # flow on any pool (a CPU worker's fallback too) changes what is served through its admin API. None: each rollout
    # starts the servers itself, as children of its own process (one machine: the demo, `draftsync serve`).
    serving_url: str | None = None
    serving_token: SecretStr | None = None  # the admin API's bearer token; required wherever serving_url is used

    @field_validator("sync_profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        from draftsync.profiles import PROFILES

        if value not in PROFILES and not os.path.lexists(value):
            raise ValueError(f"{value!r} is neither a profile ({', '.join(PROFILES)}) nor a profile file")
        return value

    @field_validator("gpu_pool_gpus")
    @classmethod
    def _offered_gpu_count(cls, value: int) -> int:
        if value not in GPU_COUNTS:
            raise ValueError(f"the GPU pool's nodes hold {', '.join(map(str, GPU_COUNTS))} GPUs (a sync trigger each)")
        return value

    @field_validator("report_timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo

        try:
            ZoneInfo(value)
        except (ValueError, KeyError, OSError) as error:  # a bad key, or one the time zone database does not hold
            raise ValueError(f"{value!r} is not an IANA time zone such as UTC or Europe/Berlin") from error
        return value

    @classmethod
    def load(cls) -> Settings:
        """The settings, or one clear error naming the variable that is wrong and what it takes."""
        from pydantic import ValidationError

        from draftsync.errors import DraftsyncError

        try:
            return cls()
        except ValidationError as error:
            problem = error.errors()[0]
            name = "DRAFTSYNC_" + "_".join(str(part) for part in problem["loc"]).upper()
            raise DraftsyncError(
                f"setting {name}={problem.get('input')!r}: {problem['msg']}",
                f"set {name} to a valid value or unset it (the environment, the env file {ENV_FILE_VARIABLE} names, "
                f"or the work dir's {WORKDIR_SETTINGS_FILE})",
            ) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment, then the env file DRAFTSYNC_ENV_FILE names, then the work dir's settings file."""
        from_file = env_file_values()
        workdir = Path(
            os.environ.get("DRAFTSYNC_WORKDIR") or from_file.get("DRAFTSYNC_WORKDIR") or DEFAULT_WORKDIR
        ).expanduser()
        in_workdir = DotEnvSettingsSource(
            settings_cls, env_file=workdir / WORKDIR_SETTINGS_FILE, env_prefix="DRAFTSYNC_"
        )
        sources = [init_settings, env_settings]
        if from_file:
            named = Path(os.environ[ENV_FILE_VARIABLE].strip()).expanduser()
            sources.append(DotEnvSettingsSource(settings_cls, env_file=named, env_prefix="DRAFTSYNC_"))
        return (*sources, in_workdir, file_secret_settings)

    @property
    def root(self) -> Path:
        return self.workdir.expanduser().resolve()

    @property
    def mlflow_tracking_uri(self) -> str:
        return variable("MLFLOW_TRACKING_URI") or self.embedded_mlflow_uri

    @property
    def embedded_mlflow_uri(self) -> str:
        """The registry used when MLFLOW_TRACKING_URI is unset: SQLite in the work dir."""
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def mlflow_artifacts_dir(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def monitor_url(self) -> str:
        return self.monitor_db_url or f"sqlite:///{self.root / 'monitor.db'}"

    @property
    def deployments_path(self) -> Path:
        return self.deployments_file or self.root / "deployments.yaml"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def outbox_dir(self) -> Path:
        return self.root / "outbox"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def model_root_paths(self) -> list[Path]:
        """The work dir, then each DRAFTSYNC_MODEL_ROOTS entry, resolved (symlinks followed), without repeats."""
        return list(dict.fromkeys([self.root, *_paths(self.model_roots)]))

    @property
    def model_mirror_paths(self) -> list[Path]:
        return list(dict.fromkeys(_paths(self.model_mirrors)))

    @property
    def target_names(self) -> list[str]:
        return [name.strip() for name in self.targets.split(",") if name.strip()]

    @property
    def alert_recipients(self) -> list[str]:
        return [a.strip() for a in self.alert_to.split(",") if a.strip()]


def env_file_values() -> dict[str, str]:
    """The variables of the file DRAFTSYNC_ENV_FILE names, those with a value ({} when it is unset).

    A file named but missing or unreadable is an error: a flow run would otherwise go on with the embedded defaults."""
    named = os.environ.get(ENV_FILE_VARIABLE, "").strip()
    if not named:
        return {}
    from dotenv import dotenv_values

    from draftsync.errors import DraftsyncError

    path = Path(named).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise DraftsyncError(
            f"{ENV_FILE_VARIABLE}={named} cannot be read ({reason})",
            f"mount the env file there (a work pool: the Secret or volume its job variables name), make it readable "
            f"by this user, or unset {ENV_FILE_VARIABLE}",
        ) from None
    return {key: value for key, value in dotenv_values(stream=io.StringIO(text)).items() if value}


def variable(name: str) -> str | None:
    """An environment variable, else its value in the env file DRAFTSYNC_ENV_FILE names (None when neither has it)."""
    return os.environ.get(name) or env_file_values().get(name)


def debug_requested() -> bool:
    """`--debug` / DRAFTSYNC_DEBUG, read without validating the other settings (an error about them must print)."""
    return os.environ.get("DRAFTSYNC_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def write_workdir_settings(root: Path, values: dict[str, str]) -> Path:
    """Set DRAFTSYNC_ variables in the work dir's settings file (others it holds are kept); returns its path."""
    from draftsync.files import atomic_write

    path = root / WORKDIR_SETTINGS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    kept = [line for line in lines if line.split("=", 1)[0].strip() not in values]
    text = "\n".join([*kept, *(f"{key}={value}" for key, value in values.items())]) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))
    return path


def _paths(listed: str) -> list[Path]:
    """Comma- or os.pathsep-separated directories, resolved (symlinks followed)."""
    entries = [entry.strip() for entry in re.split(f"[,{re.escape(os.pathsep)}]", listed)]
    return [Path(entry).expanduser().resolve() for entry in entries if entry]


def apply_environment(settings: Settings) -> None:
    """Point MLflow and Prefect at the work dir and keep every library offline and quiet (the hub stays reachable
    only where DRAFTSYNC_HUB_DOWNLOADS allows it).

    The env file's variables are exported first (the environment wins), so that MLflow's and Prefect's own settings
    in it (MLFLOW_TRACKING_USERNAME, PREFECT_API_AUTH_STRING, ...) reach the libraries and the processes draftsync
    starts. Must run before prefect or mlflow is imported: both read their settings at import time (in a flow run
    Prefect is already connected: its worker gives it PREFECT_API_URL).
    """
    from draftsync.user_files import make_folder

    for key, value in env_file_values().items():
        os.environ.setdefault(key, value)
    make_folder(settings.root, "work dir", "give --workdir (or DRAFTSYNC_WORKDIR) a folder you can write to")
    defaults = {
        "DO_NOT_TRACK": "true",
        "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
        "PREFECT_HOME": str(settings.prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "MLFLOW_LOGGING_LEVEL": "WARNING",
        "GIT_PYTHON_REFRESH": "quiet",
    }
    if settings.hub_downloads:
        del defaults["HF_HUB_OFFLINE"], defaults["TRANSFORMERS_OFFLINE"]
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
