"""Scale-out training with the `speculators` package: render and run `speculators train` on a GPU worker.

draftsync's own trainer (training.py) runs wherever torch runs. For large targets, training moves to a GPU
worker whose environment has speculators and vLLM: vLLM serves the target and writes its hidden states,
speculators prepares the data and trains the drafter under torchrun. What comes out is a speculators
`eagle3` checkpoint, which `load_eagle3` reads and vLLM serves (`make compat` checks both ends).

The pipeline, in speculators 0.9.0's own commands (offline hidden states: generated once, read back for
every epoch, so the GPUs go to vLLM first and to training after):
1. `vllm serve <target>` with the `extract_hidden_states` speculative method and draftsync's hidden-states connector
   (vLLM's file connector, which speculators' scripts/launch_vllm.py starts, made to run on the CPU build too;
   `speculative/data/vllm_connector.py`): `hidden_state_server_command`;
2. `speculators prepare-data`: JSONL rows of `input_ids` + `loss_mask` (`write_token_rows`), or chat
   `conversations` rendered by that server; token frequencies for the draft vocabulary;
3. `speculators generate-offline-data`: the server's hidden states for every row, to disk;
4. the server stops, then `speculators train` (one GPU) or `torchrun ... -m speculators.train`, which
   writes one checkpoint per epoch, `<output_dir>/<epoch>/` (`latest_checkpoint`).
Steps 2-4 are `render_commands`; `run_job` runs all four. Commands are argument lists, never shell strings.

The rendered training flags pin the architecture instead of leaning on speculators' defaults, which
differ from draftsync's: one decoder layer with full attention (speculators defaults to sliding-window
layers), the method's norms (its eagle3 default adds norm_before_fc and norm_output), explicit aux layer ids.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import EAGLE, EAGLE3, EAGLE3_1, MEDUSA

# speculators' flags for each method's norms (EAGLE 3.1 = per-aux-state fc norms + post-norm fed back).
METHOD_FLAGS = {
    EAGLE3.name: ("--no-norm-before-fc", "--no-norm-output"),
    EAGLE3_1.name: ("--fc-norm", "--no-norm-before-fc", "--norm-output"),
}
METHODS = tuple(METHOD_FLAGS)  # the EAGLE-3 family: what speculators trains
TRAIN_MODULE = "speculators.train"
INSTALL_FIX = "install speculators and vllm on the GPU worker (pip install speculators vllm), or run the job there"


@dataclass(frozen=True)
class SpeculatorsTrainJob:
    """One `speculators train` run; every field maps to a flag speculators 0.9.0 (or vLLM, torchrun) accepts."""

    target: str  # target checkpoint dir or hub id: vllm serve, --model, --verifier-name-or-path
    data: tuple[str, ...]  # JSONL files or dirs (prepare-data --data, repeated)
    work_dir: str  # prepared dataset and hidden states (<work_dir>/prepared, its hidden_states/)
    output_dir: str  # checkpoints (--save-path); speculators resumes from the latest one found there
    method: str = EAGLE3.name  # one of METHODS
    draft_vocab_size: int | None = None  # None: the target's whole vocabulary
    aux_layer_ids: tuple[int, ...] | None = None  # None: default_aux_layer_ids(target layers)
    target_num_layers: int | None = None  # None: read from <target>/config.json
    norm_before_residual: bool = True  # draftsync's Eagle3Config default, as speculators'
    epochs: int = 20
    lr: float = 1e-3
    ttt_steps: int = 3
    seq_length: int = 8192  # prepare-data: longest sample kept (tokens)
    total_seq_len: int = 8192  # train: tokens packed per batch
    max_samples: int | None = None
    conversations: bool = False  # data rows are chat `conversations` (rendered by the vLLM server)
    from_pretrained: str | None = None  # warm start from a previous drafter (speculators format)
    seed: int = 0
    gpus_per_node: int = 1
    nnodes: int = 1
    rdzv_endpoint: str | None = None  # host:port on node 0; needed when nnodes > 1
    rdzv_id: str = "draftsync"
    vllm_port: int = 8000
    vllm_tensor_parallel_size: int = 1
    vllm_data_parallel_size: int = 1
    extra_train_args: tuple[str, ...] = ()  # passed through to speculators train as they are

    def __post_init__(self) -> None:
        for name in ("target", "work_dir", "output_dir"):
            value = getattr(self, name)
            if not str(value):
                raise DraftsyncError(f"speculators job field {name} is empty", f"set {name}")
            object.__setattr__(self, name, str(value))
        data = (self.data,) if isinstance(self.data, (str, Path)) else tuple(self.data)
        if not data:
            raise DraftsyncError("speculators job has no data", "pass one or more JSONL files or directories as data")
        object.__setattr__(self, "data", tuple(str(path) for path in data))
        object.__setattr__(self, "extra_train_args", tuple(str(arg) for arg in self.extra_train_args))
        if self.from_pretrained is not None:
            object.__setattr__(self, "from_pretrained", str(self.from_pretrained))
        if self.method not in METHODS:
            raise DraftsyncError(
                f"speculators backend method {self.method!r} is not one of {list(METHODS)}",
                f"train {EAGLE} and {MEDUSA} drafters with draftsync's own trainer",
            )
        if self.aux_layer_ids is not None:
            ids = tuple(int(k) for k in self.aux_layer_ids)
            if len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0:
                raise DraftsyncError(
                    f"aux layer ids {list(ids)} are not three distinct ids >= 0",
                    "give three distinct target layer ids (or none for the default)",
                )
            object.__setattr__(self, "aux_layer_ids", ids)
        for name in (
            "epochs",
            "ttt_steps",
            "seq_length",
            "total_seq_len",
            "gpus_per_node",
            "nnodes",
            "vllm_tensor_parallel_size",
            "vllm_data_parallel_size",
        ):
            if getattr(self, name) < 1:
                raise DraftsyncError(
                    f"speculators job field {name}={getattr(self, name)} is below 1", f"set {name} to 1 or more"
                )
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise DraftsyncError(
                f"draft_vocab_size={self.draft_vocab_size} is below 1",
                "set a positive draft vocabulary size, or None for the target's vocabulary",
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise DraftsyncError(
                f"a {self.nnodes}-node speculators job has no rdzv_endpoint",
                "set rdzv_endpoint to host:port of node 0 (torchrun's c10d rendezvous)",
            )

    @property
    def prepared_dir(self) -> str:
        return str(Path(self.work_dir) / "prepared")

    @property
    def server_scratch_dir(self) -> str:
        """Where vLLM writes hidden states before generate-offline-data moves them into prepared/."""
        return str(Path(self.work_dir) / "vllm-hidden-states")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.vllm_port}"

    def to_dict(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def target_num_layers(job: SpeculatorsTrainJob) -> int:
    """The target's decoder layer count: the job's, else its config.json (text_config for multimodal)."""
    if job.target_num_layers is not None:
        return int(job.target_num_layers)
    config_path = Path(job.target) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise DraftsyncError(
            f"cannot read the target's layer count from {config_path} ({error})",
            "set target_num_layers on the job (a hub id is not read from here)",
        ) from error
    config = config.get("text_config", config)
    if not isinstance(config.get("num_hidden_layers"), int):
        raise DraftsyncError(f"{config_path} has no num_hidden_layers", "set target_num_layers on the job")
    return config["num_hidden_layers"]


def aux_layer_ids(job: SpeculatorsTrainJob) -> tuple[int, ...]:
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, validate_aux_layer_ids

    if job.aux_layer_ids is None:
        return default_aux_layer_ids(target_num_layers(job))
    if job.target_num_layers is None and not (Path(job.target) / "config.json").is_file():
        return job.aux_layer_ids
    num_layers = target_num_layers(job)
    ids = validate_aux_layer_ids(job.aux_layer_ids, num_layers)
    if num_layers in ids:
        raise DraftsyncError(
            f"aux layer ids {list(ids)} include the target's last layer ({num_layers}): speculators reads the last "
            "state a vLLM server caches as the verifier's final one, and vLLM caches each layer once",
            f"pick aux ids below {num_layers}, e.g. {list(default_aux_layer_ids(num_layers))}",
        )
    return ids


def hidden_state_server_command(job: SpeculatorsTrainJob) -> list[str]:
    """`vllm serve` writing the aux states and the last layer's output of every request to disk."""
    from draftsync.speculative.data.vllm_connector import (
        captured_layer_ids,
        extract_hidden_states_config,
        hidden_states_connector_config,
    )

    speculative_config = extract_hidden_states_config(captured_layer_ids(aux_layer_ids(job), target_num_layers(job)))
    kv_transfer_config = hidden_states_connector_config(job.server_scratch_dir)
    return [
        "vllm",
        "serve",
        job.target,
        "--host",
        "127.0.0.1",
        "--port",
        str(job.vllm_port),
        "--tensor-parallel-size",
        str(job.vllm_tensor_parallel_size),
        "--data-parallel-size",
        str(job.vllm_data_parallel_size),
        "--speculative-config",
        json.dumps(speculative_config, separators=(",", ":")),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config, separators=(",", ":")),
    ]


def prepare_data_command(job: SpeculatorsTrainJob) -> list[str]:
    command = ["speculators", "prepare-data", "--model", job.target]
    for path in job.data:
        command += ["--data", path]
    command += ["--output", job.prepared_dir, "--seq-length", str(job.seq_length), "--seed", str(job.seed)]
    if job.max_samples is not None:
        command += ["--max-samples", str(job.max_samples)]
    if job.conversations:
        command += ["--render-endpoint", job.endpoint]
    if job.draft_vocab_size is not None:
        command.append("--no-skip-token-freq")  # token_freq.pt, from which train builds the draft vocabulary
    return command


def generate_hidden_states_command(job: SpeculatorsTrainJob) -> list[str]:
    return [
        "speculators",
        "generate-offline-data",
        "--model",
        job.target,
        "--endpoint",
        f"{job.endpoint}/v1",
        "--preprocessed-data",
        job.prepared_dir,
        "--validate-outputs",
    ]


def train_arguments(job: SpeculatorsTrainJob) -> list[str]:
    """The flags of `speculators train` (identical under torchrun's `-m speculators.train`)."""
    assert EAGLE3.speculators_type is not None  # set for the EAGLE-3 family (speculative/methods)
    args = [
        "--verifier-name-or-path",
        job.target,
        "--speculator-type",
        EAGLE3.speculators_type,
        "--data-path",
        job.prepared_dir,
        "--save-path",
        job.output_dir,
    ]
    if job.from_pretrained:
        args += ["--from-pretrained", job.from_pretrained]  # its config fixes the layers; shaping flags conflict
    else:
        args += ["--num-layers", "1", "--draft-arch", "llama", "--full-attention-indices", "0"]
    args += ["--target-layer-ids", *(str(k) for k in aux_layer_ids(job))]
    args.append("--norm-before-residual" if job.norm_before_residual else "--no-norm-before-residual")
    args += METHOD_FLAGS[job.method]
    if job.draft_vocab_size is not None:
        args += ["--draft-vocab-size", str(job.draft_vocab_size)]
    args += [
        "--ttt-steps",
        str(job.ttt_steps),
        "--epochs",
        str(job.epochs),
        "--lr",
        repr(float(job.lr)),
        "--total-seq-len",
        str(job.total_seq_len),
        "--on-missing",
        "raise",  # offline: every hidden state is on disk; a gap is an error, not a request
        "--seed",
        str(job.seed),
    ]
    return args + list(job.extra_train_args)


def train_command(job: SpeculatorsTrainJob) -> list[str]:
    """`speculators train` on one GPU; torchrun (standalone, or c10d rendezvous across nodes) otherwise."""
    if job.nnodes == 1 and job.gpus_per_node == 1:
        return ["speculators", "train", *train_arguments(job)]
    if job.nnodes == 1:
        launcher = ["torchrun", "--standalone", "--nproc-per-node", str(job.gpus_per_node)]
    else:
        assert job.rdzv_endpoint is not None  # __post_init__ requires one when nnodes > 1
        launcher = [
            "torchrun",
            "--nnodes",
            str(job.nnodes),
            "--nproc-per-node",
            str(job.gpus_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            job.rdzv_endpoint,
            "--rdzv-id",
            job.rdzv_id,
        ]
    return [*launcher, "-m", TRAIN_MODULE, *train_arguments(job)]


def render_commands(job: SpeculatorsTrainJob) -> list[list[str]]:
    """prepare-data, generate-offline-data (both need `hidden_state_server_command` running), then train."""
    return [prepare_data_command(job), generate_hidden_states_command(job), train_command(job)]


def write_token_rows(
    path: str | Path, sequences: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]] | None = None
) -> Path:
    """Token sequences as the JSONL rows prepare-data passes through untouched: {"input_ids", "loss_mask"}."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as handle:
        for index, sequence in enumerate(sequences):
            mask = list(loss_masks[index]) if loss_masks is not None else [1] * len(sequence)
            if len(mask) != len(sequence):
                raise DraftsyncError(
                    f"row {index}: {len(sequence)} tokens but {len(mask)} loss-mask entries",
                    "give one loss-mask entry per token",
                )
            handle.write(json.dumps({"input_ids": [int(t) for t in sequence], "loss_mask": [int(m) for m in mask]}))
            handle.write("\n")
    return out


def missing_executables(commands: Sequence[Sequence[str]], env: dict[str, str] | None = None) -> list[str]:
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    missing = []
    for command in commands:
        if shutil.which(command[0], path=path) is None and command[0] not in missing:
            missing.append(command[0])
    return missing


REQUIRED_EXECUTABLES = ("vllm", "speculators")  # the server of the hidden states, and the trainer


HIDDEN_STATES_METHOD = "extract_hidden_states"  # the speculative method the hidden-state server runs with
# Run by the vllm executable's own interpreter: its version, and whether its speculative methods (a nested Literal)
# include the hidden-state extraction. Importing the config module loads no model and needs no GPU.
_VLLM_PROBE = """
import sys
import typing
from vllm.config import speculative
from vllm.version import __version__

def names(kind):
    args = typing.get_args(kind)
    if args:
        return set().union(*map(names, args))
    return {kind} if isinstance(kind, str) else set()

print(__version__, sys.argv[1] in names(speculative.SpeculativeMethod))
"""


def check_installed(env: dict[str, str] | None = None, probe_timeout_s: float = 300.0) -> None:
    """Refuse, naming the install step, on a worker without speculators or vLLM, or with a vLLM that cannot serve the
    hidden states speculators trains from: before any data or GPU work."""
    _check_executables([[name] for name in REQUIRED_EXECUTABLES], env)
    check_vllm_extracts_hidden_states(env, probe_timeout_s)


def check_vllm_extracts_hidden_states(env: dict[str, str] | None = None, timeout_s: float = 300.0) -> None:
    """Ask the `vllm` on PATH, through its own interpreter, whether it has the `extract_hidden_states` speculative
    method: an older vLLM would fail only once its server starts, after the data is drawn."""
    environment = dict(env if env is not None else os.environ)
    executable = shutil.which("vllm", path=environment.get("PATH", os.defpath))
    if executable is None:
        raise DraftsyncError("vllm not found on PATH", INSTALL_FIX)
    interpreter = _interpreter_of(Path(executable), environment.get("PATH", os.defpath))
    try:
        done = subprocess.run(
            [interpreter, "-c", _VLLM_PROBE, HIDDEN_STATES_METHOD],
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise DraftsyncError(
            f"the vllm at {executable} did not answer which speculative methods it has within {timeout_s:.0f} s",
            f"check that `{interpreter} -c 'import vllm'` works on the worker",
        ) from None
    except OSError as error:
        raise DraftsyncError(
            f"the vllm at {executable} names an interpreter {interpreter} that cannot run ({error.strerror})",
            INSTALL_FIX,
        ) from None
    answer = done.stdout.split()
    if done.returncode != 0 or len(answer) != 2:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise DraftsyncError(
            f"the vllm at {executable} cannot be imported by {interpreter} ({last})",
            INSTALL_FIX,
        )
    version, has_method = answer
    if has_method != "True":
        raise DraftsyncError(
            f"vllm {version} at {executable} has no {HIDDEN_STATES_METHOD!r} speculative method, which serves the "
            "hidden states speculators trains from",
            f"upgrade vllm on the worker to a release with {HIDDEN_STATES_METHOD} (pip install -U vllm), or train "
            "with draftsync's own trainer (trainer: draftsync in the profile)",
        )


def _interpreter_of(executable: Path, path: str) -> str:
    """The Python a console script runs under (its shebang), or this one's for anything else."""
    try:
        with executable.open("rb") as script:
            first = script.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable
    if first.startswith("#!"):
        words = first[2:].split()
        if words and Path(words[0]).name.startswith("python"):
            return words[0]
        if len(words) > 1 and Path(words[0]).name == "env" and words[1].startswith("python"):
            return shutil.which(words[1], path=path) or sys.executable
    return sys.executable


def _check_executables(commands: Sequence[Sequence[str]], env: dict[str, str] | None) -> None:
    missing = missing_executables(commands, env)
    if missing:
        raise DraftsyncError(f"{', '.join(missing)} not found on PATH", INSTALL_FIX)


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_commands(
    commands: Sequence[Sequence[str]],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    on_line: Callable[[str], None] = _print_line,
) -> None:
    """Run each command in turn (no shell), streaming its output lines; stop at the first that fails.

    Every executable is looked up before the first command starts, so a worker without speculators
    fails at once instead of after hours of data generation.
    """
    _check_executables(commands, env)
    for command in commands:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        try:
            assert process.stdout is not None  # stdout=PIPE
            for line in process.stdout:
                on_line(line.rstrip("\n"))
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
        if code != 0:
            raise DraftsyncError(
                f"`{' '.join(command[:2])}` exited with status {code}",
                "read its output above; fix the cause and run the job again (training resumes "
                "from the latest checkpoint in the output directory)",
            )


def _stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the command's process group (torchrun and vLLM have children), SIGKILL after a grace period."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def _wait_until_serving(process: subprocess.Popen, url: str, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DraftsyncError(
                f"the hidden-state server exited with status {process.returncode} before serving",
                f"read {log_path}; check that vLLM supports extract_hidden_states and the target loads",
            )
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise DraftsyncError(
        f"the hidden-state server did not answer {url} within {timeout_s:.0f} s",
        f"read {log_path}; raise server_timeout_s for a large target",
    )


def latest_checkpoint(output_dir: str | Path) -> Path:
    """The drafter speculators train left: `checkpoint_best` (with --save-best), else the last epoch's dir."""
    root = Path(output_dir)
    best = root / "checkpoint_best"
    if (best / "config.json").is_file():
        return best
    epochs = [d for d in root.iterdir() if d.is_dir() and d.name.isdigit()] if root.is_dir() else []
    if not epochs:
        raise DraftsyncError(
            f"{root} holds no speculators checkpoint (no epoch directory)",
            "run the training step to completion, or point at the save path it used",
        )
    return max(epochs, key=lambda d: int(d.name))


def run_job(
    job: SpeculatorsTrainJob,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    on_line: Callable[[str], None] = _print_line,
    server_timeout_s: float = 1800.0,
) -> Path:
    """The whole pipeline on this worker; returns the trained drafter's directory (load_eagle3 reads it)."""
    server = hidden_state_server_command(job)
    data_steps = [prepare_data_command(job), generate_hidden_states_command(job)]
    training = train_command(job)
    _check_executables([server, *data_steps, training], env)
    Path(job.work_dir).mkdir(parents=True, exist_ok=True)
    log_path = Path(job.work_dir) / "vllm-server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            server, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _wait_until_serving(process, f"{job.endpoint}/v1/models", server_timeout_s, log_path)
            run_commands(data_steps, env=env, cwd=cwd, on_line=on_line)
        finally:
            _stop(process)  # the GPUs go to training
    run_commands([training], env=env, cwd=cwd, on_line=on_line)
    return latest_checkpoint(job.output_dir)
