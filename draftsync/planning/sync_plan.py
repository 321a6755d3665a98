"""A sync's plan: for each stage, what it needs of the worker (GPU and host memory, disk, time) and the settings
that make it fit, or a refusal that names the stage, the number that does not fit and the fix.

The stages are the sync's: `responses` (the target writes its own answers), `hidden_states` (its teacher-forced
pass over every training sequence), `training` (the drafter's steps) and `validation` (a server with the target
and the drafter). Memory comes from shapes: the target's weights from its config (or its safetensors headers), a
training step from `speculative.train.step_memory` (checked against measurement by bench/train_memory.py), servers and
forward passes from their weights plus stated margins. Times are estimates from stated throughputs, not
measurements: they say whether a sync takes hours or weeks, no more.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.profiles import SyncProfile
from draftsync.records import record_dict
from draftsync.speculative.methods import METHODS, is_eagle3_family
from draftsync.speculative.placement import TargetPlacement

GiB = 1024**3
GPU_RESERVE_GIB = 2.0  # per GPU: the CUDA context, the allocator's slack and fragmentation
HOST_RESERVE_GIB = 1.0  # kept free for the worker's own processes beside what the plan counts
SERVER_KV_MIN_GIB = 4.0  # a vLLM server's KV cache and activations beyond its weights, at the least
DEVICE_MAP_OVERHEAD = 1.10  # accelerate's device_map does not split layers evenly: a tenth more than the weights
FORWARD_TOKENS = 8192  # tokens of one teacher-forced pass (the shard writer's max_batch_tokens)
SHARD_TOKENS = 65536  # tokens the shard writer buffers in host memory before it writes a shard
HOST_WORKING_GIB = 2.0  # a GPU stage's host memory beyond its buffers: the process, torch, the tokenizer
# Throughputs behind the time estimates (assumed, not measured): an H100-class GPU at 40% of its 989 bf16 TFLOP/s
# for passes and training, and 60% of its 3.35 TB/s for decoding; a CPU worker at 0.2 TFLOP/s.
GPU_FLOPS = 0.4 * 989e12
GPU_BANDWIDTH = 0.6 * 3.35e12
CPU_FLOPS = 0.2e12
DECODE_BATCH = 64  # sequences a response server decodes at once
AVERAGE_TEXT_TOKENS = 512  # a training text of the built-in corpora, in a Llama-3-class tokenizer (assumed)
PROMPT_TOKENS = 64


@dataclass(frozen=True)
class TargetShape:
    """What the plan needs of a target: its widths and its size, from its config (a config-only directory will do)."""

    name: str
    parameters: int
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    checkpoint_dtype: str
    config: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_directory(cls, path: Path, name: str | None = None) -> TargetShape:
        from draftsync.speculative.targets import read_target_config

        config = read_target_config(Path(path))
        config = config.get("text_config", config) if "hidden_size" not in config else config
        needed = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
        missing = [k for k in needed if k not in config]
        if missing:
            raise DraftsyncError(
                f"{Path(path) / 'config.json'} lacks {', '.join(missing)}: not a decoder-only language model's config",
                "give a Llama-style causal LM (Llama, Mistral, Qwen2/3 and the like)",
            )
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        shape = cls(
            name=name or str(path),
            parameters=0,
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            vocab=int(config["vocab_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config.get("intermediate_size") or 4 * hidden),
            checkpoint_dtype=str(config.get("dtype") or config.get("torch_dtype") or "float32").replace("torch.", ""),
            config=config,
        )
        counted = _safetensors_parameters(Path(path))
        return replace(shape, parameters=counted or shape.parameters_from_config())

    @classmethod
    def from_registered(
        cls, name: str, *, parameters: int, hidden: int, layers: int, vocab: int, features: dict[str, Any]
    ) -> TargetShape:
        """A target as its registry tags describe it (`families.config_features`), for planning before its files are
        fetched. Versions tagged before the features named the attention heads and the MLP width get hidden // head_dim
        heads and the width the parameter count leaves (both exact for Llama-style configs)."""
        head_dim = int(features["head_dim"])
        heads = int(features.get("attention_heads") or hidden // head_dim)
        tied = bool(features.get("tied_embeddings"))
        shape = cls(
            name=name,
            parameters=parameters,
            hidden=hidden,
            layers=layers,
            vocab=vocab,
            heads=heads,
            kv_heads=int(features.get("kv_heads") or heads),
            head_dim=head_dim,
            intermediate=int(features.get("intermediate_size") or 0),
            checkpoint_dtype=str(features.get("dtype") or "bfloat16").replace("torch.", ""),
            config={"tie_word_embeddings": tied},
        )
        if shape.intermediate:
            return shape
        without_mlps = shape.parameters_from_config()  # the count's formula with no MLP width
        return replace(shape, intermediate=max(1, round((parameters - without_mlps) / (3 * hidden * layers))))

    def parameters_from_config(self) -> int:
        """A Llama-style count: embeddings, the lm_head unless tied, attention, SwiGLU MLP and norms per layer."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h
        head = 0 if self.config.get("tie_word_embeddings") else self.vocab * h
        return self.vocab * h + head + self.layers * per_layer + h

    def weight_bytes(self, on_gpu: bool) -> int:
        """fp32 on a CPU; on a GPU the checkpoint's 16-bit dtype (bf16 for an fp32 checkpoint)."""
        return self.parameters * (2 if on_gpu else 4)


def _safetensors_parameters(path: Path) -> int:
    """Parameters counted from the safetensors headers; 0 without weight files (a config-only directory) or with a
    header that cannot be read, which the target's loading then names."""
    import struct

    total = 0
    try:
        for file in sorted(path.glob("*.safetensors")):
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(min(length, 100 << 20)))
            total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return 0
    return total


@dataclass(frozen=True)
class HeldMemory:
    """GPU memory a serving deployment on this worker holds: `gib` on each of GPUs 0..gpus-1."""

    deployment: str
    gpus: int
    gib: float


@dataclass(frozen=True)
class Worker:
    """The machine a sync runs on; `detected` names the figures read from it rather than given."""

    gpus: int
    gpu_memory_gib: float
    host_memory_gib: float
    disk_gib: float
    held: tuple[HeldMemory, ...] = ()
    detected: tuple[str, ...] = ()
    nodes: int = 1  # machines like this one that training may span (torchrun's c10d rendezvous); the rest runs on one

    def free_gib(self, gpu: int) -> float:
        """What GPU `gpu` leaves a sync: its memory less what serving holds there and the reserve."""
        held = sum(h.gib for h in self.held if gpu < h.gpus)
        return self.gpu_memory_gib - held - GPU_RESERVE_GIB

    def holders(self, gpu: int) -> list[HeldMemory]:
        return [h for h in self.held if gpu < h.gpus]


@dataclass(frozen=True)
class StagePlan:
    """One stage's needs: the peak on its busiest GPU, host memory, disk written, and an estimated time."""

    stage: str
    gpu_gib: float
    host_gib: float
    disk_gib: float
    hours_estimate: float
    settings: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """Why a sync cannot run on this worker: the stage, what it needs against what there is, and the fix."""

    stage: str
    needed: str
    available: str
    fix: str

    def message(self) -> str:
        return f"the sync's {self.stage} stage needs {self.needed}; this worker has {self.available}"


@dataclass(frozen=True)
class SyncPlan:
    """Fields in the order `plan --json` shows them (`to_dict`)."""

    target: str
    parameters: int
    refusal: Refusal | None = field(default=None, kw_only=True)
    worker: Worker
    settings: dict[str, Any]  # what the sync follows: placement, devices, batch tokens, checkpointing, servers
    # Per choice (target, servers, hidden_states, training): why.
    reasons: dict[str, str] = field(default_factory=dict, kw_only=True)
    stages: tuple[StagePlan, ...]

    @property
    def fits(self) -> bool:
        return self.refusal is None

    @property
    def gpus_used(self) -> int:
        """How many of its node's GPUs the plan uses (0 on a CPU): every device it names is a GPU index below this,
        so a job given this many GPUs, numbered from 0, runs it as planned."""
        if not self.worker.gpus:
            return 0
        settings = self.settings
        used = [int(device.split(":")[1]) for device in settings["target_devices"] if device.startswith("cuda:")]
        used += settings.get("servers", {}).get("devices", [])
        ranks = settings["train_processes"] // self.worker.nodes
        if ranks > 1:
            used.append(ranks - 1)  # one rank per GPU, from GPU 0
        elif str(settings["training_device"]).startswith("cuda:"):
            used.append(int(settings["training_device"].split(":")[1]))
        return 1 + max(used, default=0)

    def require_fit(self) -> None:
        """Raise the refusal as the error a user reads (nothing has run yet)."""
        if self.refusal is not None:
            raise DraftsyncError(
                f"{self.refusal.message()}; no dataset was written and no training started", self.refusal.fix
            )

    def to_dict(self) -> dict[str, Any]:
        """The fields in their order, what the plan concludes after its size, the refusal with its message."""
        return record_dict(
            self,
            after={"parameters": {"fits": self.fits, "gpus_used": self.gpus_used}},
            refusal=None if self.refusal is None else {**asdict(self.refusal), "message": self.refusal.message()},
            worker=asdict(self.worker),
            stages=[asdict(stage) for stage in self.stages],
        )

    def run_params(self) -> dict[str, str]:
        """The plan as MLflow run parameters (flat, short values)."""
        params = {f"plan.{key}": _text(value) for key, value in self.settings.items()}
        for stage in self.stages:
            params[f"plan.{stage.stage}.gpu_gib"] = f"{stage.gpu_gib:.1f}"
            params[f"plan.{stage.stage}.host_gib"] = f"{stage.host_gib:.1f}"
            params[f"plan.{stage.stage}.disk_gib"] = f"{stage.disk_gib:.1f}"
            params[f"plan.{stage.stage}.hours_estimate"] = f"{stage.hours_estimate:.2g}"
        return params

    def profile_updates(self) -> dict[str, Any]:
        """What the sync's profile takes from the plan: the micro-batch, checkpointing, the training device and the
        data-parallel processes."""
        return {
            "batch_tokens": self.settings["batch_tokens"],
            "activation_checkpointing": self.settings["activation_checkpointing"],
            "training_device": self.settings["training_device"],
            "train_processes": self.settings["train_processes"] // self.worker.nodes,  # the profile's are a node's
            "train_nodes": self.worker.nodes,
            "data_parallel": self.settings["data_parallel"],
            "hidden_states": self.settings["hidden_states"],
        }

    def placement(self) -> TargetPlacement:
        """Where the target runs: the CPU, one GPU, or a device_map within the memory each GPU leaves it."""
        devices = tuple(self.settings["target_devices"])
        if devices == ("cpu",):
            return TargetPlacement()
        free = min(self.worker.free_gib(int(d.split(":")[1])) for d in devices)
        return TargetPlacement(devices, max_memory_gib=free if len(devices) > 1 else None)

    def markdown(self) -> str:
        """The plan as a table, for the Prefect UI and the terminal."""
        worker = self.worker
        where = (
            f"{worker.gpus} x {worker.gpu_memory_gib:.0f} GiB GPU" if worker.gpus else "no GPU"
        ) + f", {worker.host_memory_gib:.0f} GiB host memory, {worker.disk_gib:.0f} GiB disk"
        where = f"{worker.nodes} nodes of " + where if worker.nodes > 1 else where
        if worker.gpus:
            where += f"; the plan uses {self.gpus_used} GPU(s) of a node, from GPU 0"
        held = "".join(
            f"\n- serving deployment `{h.deployment}` holds {h.gib:.1f} GiB on GPUs 0-{h.gpus - 1}" for h in worker.held
        )
        rows = "\n".join(
            f"| {s.stage} | {s.gpu_gib:.1f} | {s.host_gib:.1f} | {s.disk_gib:.1f} | {s.hours_estimate:.2g} | "
            f"{', '.join(f'{k}={_text(v)}' for k, v in s.settings.items())} |"
            for s in self.stages
        )
        verdict = "fits" if self.fits else f"**refused**: {self.refusal.message()}. Fix: {self.refusal.fix}"  # type: ignore[union-attr]
        why = "".join(f"\n- {choice}: {reason}" for choice, reason in self.reasons.items())
        return (
            f"# Sync plan: {self.target} ({self.parameters / 1e9:.2f}B parameters)\n\nWorker: {where}{held}\n\n"
            f"Verdict: {verdict}\n\n| stage | GPU GiB | host GiB | disk GiB | hours (estimate) | settings |\n"
            f"|---|---|---|---|---|---|\n{rows}\n" + (f"\nWhy:{why}\n" if why else "")
        )


def size_text(gib: float) -> str:
    """GiB as a person reads them: 2,453 / 16.3 / 0.00093."""
    if gib >= 100:
        return f"{gib:,.0f}"
    return f"{gib:.1f}" if gib >= 1 else f"{gib:.2g}"


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _gib(value: float) -> float:
    return round(value / GiB, 2)


def plan_sync(target: TargetShape, worker: Worker, profile: SyncProfile, responses: int | None = None) -> SyncPlan:
    """The plan for syncing `target` with `profile` on `worker`; `refusal` set when a stage cannot fit.

    `responses`: how many distinct prompts the target answers (None: the profile's generated_samples).
    Long: the stages planned in the order a sync runs them, each on what the one before left free."""
    from draftsync.speculative.data import shard_bytes_per_token

    on_gpu = worker.gpus > 0
    weights = target.weight_bytes(on_gpu)
    responses = profile.generated_samples if responses is None else min(responses, profile.generated_samples)
    tokens = dataset_tokens(profile, responses)
    stages: list[StagePlan] = []
    settings: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    refusal: Refusal | None = None

    # Where the target runs: one GPU, else a device_map over as many as its weights need, else refused.
    if on_gpu:
        free = sorted(range(worker.gpus), key=worker.free_gib, reverse=True)
        forward = _forward_bytes(target, FORWARD_TOKENS)
        if weights + forward <= worker.free_gib(free[0]) * GiB:
            devices = [free[0]]
        else:
            devices, room = [], 0.0
            for gpu in free:
                devices.append(gpu)
                room += worker.free_gib(gpu) * GiB
                if room >= weights * DEVICE_MAP_OVERHEAD + forward:
                    break
            if room < weights * DEVICE_MAP_OVERHEAD + forward:
                refusal = _gpu_refusal("hidden_states", weights * DEVICE_MAP_OVERHEAD + forward, worker, room)
        settings["target_devices"] = [f"cuda:{gpu}" for gpu in sorted(devices)]
        placed = "one GPU" if len(devices) == 1 else f"device_map over {len(devices)} GPUs"
        need = f"its 16-bit weights ({size_text(weights / GiB)} GiB) and a {FORWARD_TOKENS:,}-token forward pass"
        reasons["target"] = (
            f"{need} fit GPU {devices[0]}'s {size_text(worker.free_gib(devices[0]))} GiB free"
            if len(devices) == 1
            else f"{need} exceed one GPU's {size_text(worker.free_gib(free[0]))} GiB free: transformers' device_map "
            f"spreads its layers over {len(devices)} GPUs for the teacher-forced pass"
        )
        settings["target_placement"] = placed if refusal is None else "none: the GPUs cannot hold it"
        settings["target_dtype"] = "float16" if target.checkpoint_dtype == "float16" else "bfloat16"
        per_gpu_target = weights * (1.0 if len(devices) == 1 else DEVICE_MAP_OVERHEAD / len(devices))
    else:
        devices = []
        settings.update(target_devices=["cpu"], target_placement="cpu", target_dtype="float32")
        reasons["target"] = "no GPU on this worker: the target runs on the CPU in fp32"
        per_gpu_target = 0.0
        forward = _forward_bytes(target, FORWARD_TOKENS)
        if weights + forward + HOST_RESERVE_GIB * GiB > worker.host_memory_gib * GiB:
            refusal = refusal or Refusal(
                "hidden_states",
                f"{_gib(weights + forward):.1f} GiB of host memory for the target in fp32 and one forward pass",
                f"{worker.host_memory_gib:.1f} GiB (with {HOST_RESERVE_GIB:g} GiB kept for the worker itself)",
                "run the sync on a GPU worker (a target this size needs one), or on a host with more memory",
            )
    flops_per_token = 2 * target.parameters
    throughput = GPU_FLOPS * max(1, len(devices)) if on_gpu else CPU_FLOPS

    # responses: a vLLM server on one GPU (its weights and a KV cache) or transformers' generate where the target runs
    generated = responses * profile.generated_max_tokens
    if responses:
        writer = profile.response_writer if profile.response_writer != "auto" else ("vllm" if on_gpu else "hf")
        response_settings: dict[str, Any] = {"writer": writer, "responses": responses}
        server_gpu = weights + SERVER_KV_MIN_GIB * GiB
        if on_gpu and writer == "vllm":
            server, server_gpu, server_refusal = _server_stage("responses", target, worker)
            response_settings.update(server)
            refusal = refusal or server_refusal
        seconds = (
            generated * weights / (GPU_BANDWIDTH * DECODE_BATCH)
            if on_gpu and writer == "vllm"
            else generated * flops_per_token / (throughput / 4)  # generate(): a quarter of the pass throughput
        )
        gpu_need = server_gpu if on_gpu and writer == "vllm" else per_gpu_target + forward
        stages.append(
            StagePlan("responses", _gib(gpu_need) if on_gpu else 0.0, 0.0, 0.0, seconds / 3600, response_settings)
        )

    reads_aux = METHODS[profile.method].reads_aux_states
    stored_bytes = shard_bytes_per_token(target.hidden, reads_aux)
    online_bytes = shard_bytes_per_token(target.hidden, reads_aux, online=True)
    stored_fits = tokens * stored_bytes <= worker.disk_gib * GiB
    mode = profile.hidden_states if profile.hidden_states != "auto" else ("offline" if stored_fits else "online")
    settings["hidden_states"] = mode
    bytes_per_token = stored_bytes if mode == "offline" else online_bytes
    disk = tokens * bytes_per_token
    # offline: one pass over the dataset; online: a pass over every step's windows (each up to its window's end)
    passed_tokens = tokens if mode == "offline" else profile.train_steps * profile.batch_size * profile.seq_len
    stages.append(
        StagePlan(
            "hidden_states",
            _gib(per_gpu_target + forward) if on_gpu else 0.0,
            _gib(weights + forward if not on_gpu else SHARD_TOKENS * bytes_per_token + HOST_WORKING_GIB * GiB),
            _gib(disk),
            passed_tokens * flops_per_token / throughput / 3600,
            {"mode": mode, "tokens": tokens, "bytes_per_token": bytes_per_token, "forward_tokens": FORWARD_TOKENS},
        )
    )
    stored_text = (
        f"{size_text(tokens * stored_bytes / GiB)} GiB of shards ({tokens:,} tokens at {stored_bytes:,} bytes)"
    )
    if mode == "offline":
        reasons["hidden_states"] = (
            f"offline: {stored_text} written once and read every epoch, within the {size_text(worker.disk_gib)} GiB "
            "of disk"
        )
    else:
        why = (
            f"{stored_text} would exceed the {size_text(worker.disk_gib)} GiB of disk"
            if not stored_fits
            else "the profile asks for it"
        )
        reasons["hidden_states"] = (
            f"online: {why}; the target computes each batch's states during training, so the disk holds "
            f"{online_bytes} bytes a token ({size_text(disk / GiB)} GiB) and the target stays loaded beside the trainer"
        )
    if disk > worker.disk_gib * GiB and refusal is None:
        refusal = Refusal(
            "hidden_states",
            f"{size_text(disk / GiB)} GiB of disk for {tokens:,} tokens of shards at {bytes_per_token:,} bytes each",
            f"{size_text(worker.disk_gib)} GiB free",
            "free disk or give the sync a larger volume (--disk-gb, DRAFTSYNC_DISK_BUDGET_GB), or sync with fewer "
            "training_texts, generated_samples or a shorter dataset_max_seq_len",
        )

    # online, the target keeps its GPU memory through training (offline its decoder layers are dropped first)
    kept = per_gpu_target if mode == "online" and on_gpu else 0.0
    training, training_settings, training_refusal = _plan_training(
        target, worker, profile, kept, online=mode == "online", target_gpus=tuple(devices)
    )
    stages.append(training)
    settings.update(training_settings)
    refusal = refusal or training_refusal

    validation_settings: dict[str, Any] = {"server": "vllm" if on_gpu else "cpu"}
    server_gpu = 0.0
    if on_gpu:
        server, server_gpu, server_refusal = _server_stage("validation", target, worker)
        validation_settings.update(server)
        refusal = refusal or server_refusal
        if server:
            settings["servers"] = server
            reasons["servers"] = (
                f"vLLM with tensor parallelism {server['tensor_parallel_size']} on GPUs "
                f"{','.join(map(str, server['devices']))}: the fewest GPUs (a power of two dividing its "
                f"{target.heads} attention heads) whose free memory holds a share of the "
                f"{size_text(weights / GiB)} GiB of weights and a KV cache, for the responses and the validation"
            )
    check = profile.validation
    low, high = check.gamma_range
    decoded = (check.requests + check.sweep_requests * (high - low + 1) + check.stress_requests) * check.max_tokens
    decoded += check.long_requests * (check.long_max_tokens or check.max_tokens)
    seconds = decoded * (weights / GPU_BANDWIDTH if on_gpu else flops_per_token / CPU_FLOPS)
    stages.append(
        StagePlan(
            "validation",
            _gib(server_gpu),
            0.0 if on_gpu else _gib(weights * 2),
            0.0,
            seconds / 3600,
            validation_settings,
        )
    )
    hungriest = max(stages, key=lambda stage: stage.host_gib)
    room = worker.host_memory_gib - HOST_RESERVE_GIB
    if hungriest.host_gib > room and refusal is None:
        refusal = Refusal(
            hungriest.stage,
            f"{hungriest.host_gib:.1f} GiB of host memory",
            f"{worker.host_memory_gib:.1f} GiB available ({HOST_RESERVE_GIB:g} GiB of it kept for the worker itself)",
            "free host memory or run the sync on a worker with more (--host-memory-gb says what a worker has)",
        )
    processes = settings["train_processes"]
    spans = f" on each of {worker.nodes} nodes (c10d rendezvous; shards on storage every node mounts)"
    holding = (
        "FSDP2 shares AdamW's state out among them, since no step holding it whole fits a GPU"
        if settings["data_parallel"] == "fsdp"
        else "DistributedDataParallel averages the gradients"
    )
    reasons["training"] = (
        f"draftsync's trainer on {processes} torchrun ranks, one per GPU{spans if worker.nodes > 1 else ''}: each "
        f"trains its slice of every step's {profile.batch_size} windows and {holding}"
        if processes > 1
        else f"draftsync's trainer in one process on {settings['training_device']}"
        + (
            f"; online states need the whole target, which runs over {len(devices)} GPUs, so no rank of its own could"
            " hold it"
            if mode == "online" and on_gpu and len(devices) > 1
            else ""
        )
    )
    settings["trainer"] = profile.trainer
    if profile.trainer == "speculators":
        reasons["training"] = (
            f"speculators' trainer (the profile asks): a vLLM server of the target writes the hidden states of the "
            f"dataset's tokens, then `speculators train` runs on {processes} torchrun rank(s); its checkpoint is "
            "imported as the drafter version"
        )
    return SyncPlan(target.name, target.parameters, worker, settings, tuple(stages), refusal=refusal, reasons=reasons)


def plan_server(target: TargetShape, worker: Worker) -> dict[str, Any] | None:
    """A vLLM server of the target that a sync starts: the fewest GPUs (a power of two dividing its attention heads)
    whose free memory holds a share of its 16-bit weights and a KV cache, and the fraction of each GPU it may take
    after what serving deployments hold there. None when no such set exists."""
    weights = target.weight_bytes(on_gpu=True)
    order = sorted(range(worker.gpus), key=worker.free_gib, reverse=True)
    size = 1
    while size <= worker.gpus:
        chosen = sorted(order[:size])
        room = min(worker.free_gib(gpu) for gpu in chosen) * GiB
        if target.heads % size == 0 and weights / size + SERVER_KV_MIN_GIB * GiB <= room:
            share = (room / GiB + GPU_RESERVE_GIB / 2) / worker.gpu_memory_gib
            return {
                "devices": chosen,
                "tensor_parallel_size": size,
                "gpu_memory_utilization": round(min(0.9, share), 2),
            }
        size *= 2
    return None


def _server_stage(stage: str, target: TargetShape, worker: Worker) -> tuple[dict[str, Any], float, Refusal | None]:
    """A stage's vLLM server: its settings, the bytes it takes on each of its GPUs, or the refusal."""
    weights = target.weight_bytes(on_gpu=True)
    server = plan_server(target, worker)
    if server is None:
        needed = weights + SERVER_KV_MIN_GIB * GiB
        return {}, needed, _gpu_refusal(stage, needed, worker, worker.free_gib(0) * GiB, 0)
    return server, weights / server["tensor_parallel_size"] + SERVER_KV_MIN_GIB * GiB, None


def _plan_training(
    target: TargetShape,
    worker: Worker,
    profile: SyncProfile,
    kept_by_target: float = 0.0,
    *,
    online: bool = False,
    target_gpus: tuple[int, ...] = (),
) -> tuple[StagePlan, dict[str, Any], Refusal | None]:
    """The largest micro-batch that fits (halving from the whole batch to one window), then activation
    checkpointing, on the GPU with the most room; refused when one window does not fit.

    On a GPU the target's decoder layers are dropped before training (its lm_head, embedding and final norm are
    all a step reads), so only the step's own memory counts; on a CPU the whole fp32 target stays in host memory.
    Online, every rank holds the whole target to compute its batches' states: on a CPU each rank's copy counts, and a
    target spread over several GPUs trains in one process, which runs it through its device_map and trains on the GPU
    with the most room left beside it.
    Long: one search over micro-batch and checkpointing, its arithmetic kept together."""
    from draftsync.speculative.train.step_memory import BF16, FP32, StepShape, drafter_parameters, predict_step_memory

    on_gpu = worker.gpus > 0
    # Every GPU trains a slice of each step's batch (the target's decoder layers are gone by then): torchrun ranks.
    # On a CPU the profile decides (gloo ranks share its cores, so one process is the default there).
    per_node = max(1, min(worker.gpus, profile.batch_size // worker.nodes)) if on_gpu else profile.train_processes
    if online and on_gpu and len(target_gpus) > 1:
        per_node = 1  # no rank could hold the whole target its batches' states need
    processes = per_node * worker.nodes

    def left_beside_target(index: int) -> float:
        """A GPU's free bytes less the target kept there: on every GPU when each rank holds its own copy."""
        holds = processes > 1 or index in target_gpus
        return worker.free_gib(index) * GiB - (kept_by_target if holds else 0.0)

    gpu = max(range(worker.gpus), key=left_beside_target) if on_gpu else 0
    device = f"cuda:{gpu}" if on_gpu else "cpu"
    if on_gpu:
        budget = left_beside_target(gpu)
    else:
        copies = per_node if online else 1  # offline, a rank reads only the target's head
        budget = (worker.host_memory_gib - HOST_RESERVE_GIB) * GiB - target.weight_bytes(False) * copies
    width = BF16 if on_gpu else FP32
    ttt = profile.ttt_steps if is_eagle3_family(profile.method) else 1
    draft_vocab = min(profile.draft_vocab_size, target.vocab)
    whole = profile.batch_size * profile.seq_len
    candidates = []
    tokens = whole
    while tokens >= profile.seq_len:
        candidates.append((tokens, False))
        tokens //= 2
    candidates += [(profile.seq_len, True)]
    # DDP at the largest micro-batch that fits; FSDP2 (AdamW's state shared out) only where no DDP step fits.
    if profile.data_parallel != "auto" or processes == 1:
        replicas = [profile.data_parallel if profile.data_parallel != "auto" else "ddp"]
    else:
        replicas = ["ddp", "fsdp"]
    chosen = None
    for replica in replicas:
        for tokens, checkpointing in candidates:
            shape = StepShape(
                hidden=target.hidden,
                vocab=target.vocab,
                draft_vocab=draft_vocab,
                heads=target.heads,
                kv_heads=target.kv_heads,
                head_dim=target.head_dim,
                intermediate=target.intermediate,
                batch=tokens // profile.seq_len,
                seq_len=profile.seq_len,
                ttt_steps=ttt,
                head_bytes=width,
                activation_bytes=width,
                checkpointing=checkpointing,
                optimizer_shards=processes if replica == "fsdp" else 1,
            )
            memory = predict_step_memory(shape)["total"]
            chosen = (tokens, checkpointing, memory, replica)  # the last tried is the smallest, for a refusal
            if memory <= budget:
                break
        if chosen is not None and chosen[2] <= budget:
            break
    assert chosen is not None
    tokens, checkpointing, memory, replica = chosen
    accumulation = math.ceil(whole / tokens)
    trainable, _ = drafter_parameters(shape)
    steps = profile.train_steps
    flops = steps * whole * (6 * trainable + 2 * target.hidden * target.vocab) * (ttt if ttt else 1)
    seconds = flops / (GPU_FLOPS * processes if on_gpu else CPU_FLOPS)
    settings = {
        "train_processes": processes,
        "data_parallel": replica,
        "training_device": device,
        "batch_tokens": tokens,
        "accumulation": accumulation,
        "activation_checkpointing": checkpointing,
    }
    stage = StagePlan(
        "training",
        _gib(memory) if on_gpu else 0.0,
        _gib(memory) if not on_gpu else HOST_WORKING_GIB,
        0.0,
        seconds / 3600,
        {
            "micro_batch_tokens": tokens,
            "accumulation": accumulation,
            "activation_checkpointing": checkpointing,
            "train_processes": processes,
        },
    )
    refusal = None
    if memory > budget:
        where = f"GPU {device}" if on_gpu else "host memory"
        refusal = Refusal(
            "training",
            f"{_gib(memory):.1f} GiB on {where} for one {profile.seq_len}-token window with activation checkpointing "
            "(the drafter, AdamW, the target's head)",
            f"{_gib(budget):.1f} GiB free there",
            "use a GPU with more memory, a shorter seq_len or a smaller draft_vocab_size in the sync profile",
        )
    return stage, settings, refusal


def _forward_bytes(target: TargetShape, tokens: int) -> int:
    """One teacher-forced pass of `tokens` tokens: per token a layer's activations (16-bit), the kept states."""
    per_token = 2 * (6 * target.hidden + 2 * target.intermediate) + 4 * 4 * target.hidden
    return tokens * per_token


def _gpu_refusal(stage: str, needed: float, worker: Worker, room: float, gpu: int | None = None) -> Refusal:
    holders = worker.holders(gpu if gpu is not None else 0)
    held = "; ".join(f"serving deployment {h.deployment} holds {h.gib:.1f} GiB of each of its GPUs" for h in holders)
    usable = max(worker.gpu_memory_gib - GPU_RESERVE_GIB, 1.0)
    wanted = 2 ** math.ceil(math.log2(max(1.0, needed / GiB / usable)))
    fix = f"give the sync a worker of at least {wanted} x {worker.gpu_memory_gib:.0f} GiB GPUs" + (
        f", or free the GPUs that {', '.join(h.deployment for h in holders)} hold" if holders else ""
    )
    what = "server" if stage == "validation" else "16-bit weights and one forward pass"
    there = f"{size_text(room / GiB)} GiB free on {worker.gpus} x {worker.gpu_memory_gib:.0f} GiB"
    return Refusal(
        stage,
        f"{size_text(needed / GiB)} GiB of GPU memory for the target's {what}",
        there + (f" ({held})" if held else ""),
        fix,
    )


def dataset_tokens(profile: SyncProfile, responses: int) -> int:
    """Tokens of the sync's dataset, estimated before the target's tokenizer has read a text: each text at
    AVERAGE_TEXT_TOKENS (cut at dataset_max_seq_len) and each response at its longest, after a PROMPT_TOKENS prompt.
    The dataset task checks the exact count against the disk again before it writes."""
    longest = profile.dataset_max_seq_len or 1 << 30
    texts = profile.training_texts * min(AVERAGE_TEXT_TOKENS, longest)
    return texts + responses * min(PROMPT_TOKENS + profile.generated_max_tokens, longest)


def detect_worker(root: Path, held: tuple[HeldMemory, ...] = (), **given: float | None) -> Worker:
    """The worker's figures: those `given` (not None) as they are, the rest read from this machine."""
    import shutil

    detected: list[str] = []
    gpus = given.get("gpus")
    memory = given.get("gpu_memory_gib")
    if gpus is None or (gpus and memory is None):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus is None:
            gpus, detected = count, [*detected, "gpus"]
        if gpus and memory is None:
            memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) / GiB
            detected.append("gpu_memory_gib")
    host = given.get("host_memory_gib")
    if host is None:
        host, detected = _available_host_memory() / GiB, [*detected, "host_memory_gib"]
    disk = given.get("disk_gib")
    if disk is None:
        existing = next(p for p in (root, *root.parents) if p.exists())
        disk, detected = shutil.disk_usage(existing).free / GiB, [*detected, "disk_gib"]
    return Worker(int(gpus), float(memory or 0.0), float(host), float(disk), held, tuple(detected))


def _available_host_memory() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
