"""A sync's plan: for each stage, what it needs of the worker (GPU and host memory, disk, time), which GPUs it holds
while it runs, and the settings that make it fit, or a refusal that names the stage, the number that does not fit and
the fix.

The plan is the one source of placement: the target's devices (transformers), the servers' GPUs, share and context
(vLLM), and the training ranks' GPUs are all read from it by the processes a sync starts. The stages run one after
another (stages.py); before any work, `overlap_refusal` refuses a plan whose stages would share a GPU beyond its
memory. Memory comes from shapes: the target's weights from its config (or its safetensors headers), a training step
from `speculative.train.step_memory` (with the margin its measurements showed), servers from their weights, drafter and
context. Times are estimates from stated throughputs, not measurements: they say whether a sync takes hours or weeks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.planning.servers import server_occupant, server_reason, server_stage
from draftsync.planning.stages import Occupant, Refusal, StagePlan, gpu_refusal, overlap_refusal
from draftsync.planning.target_shape import TargetShape, forward_bytes
from draftsync.planning.training_plan import (
    CPU_FLOPS,
    GPU_FLOPS,
    HOST_WORKING_GIB,
    check_drafter_settings,
    plan_training,
)
from draftsync.planning.worker import HOST_RESERVE_GIB, GiB, Worker, gib, size_text
from draftsync.profiles import SyncProfile
from draftsync.records import record_dict
from draftsync.speculative.methods import METHODS
from draftsync.speculative.placement import TargetPlacement, visible_devices

DEVICE_MAP_OVERHEAD = 1.10  # accelerate's device_map does not split layers evenly: a tenth more than the weights
FORWARD_TOKENS = 8192  # tokens of one teacher-forced pass (the shard writer's max_batch_tokens)
SHARD_TOKENS = 65536  # tokens the shard writer buffers in host memory before it writes a shard
GPU_BANDWIDTH = 0.6 * 3.35e12  # decoding on an H100-class GPU at 60% of its memory bandwidth (assumed)
DECODE_BATCH = 64  # sequences a response server decodes at once
AVERAGE_TEXT_TOKENS = 512  # a training text of the built-in corpora, in a Llama-3-class tokenizer (assumed)
PROMPT_TOKENS = 64


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
    # What the target is (TargetDescription.summary): total and active parameters, experts, quantization, weights.
    target_facts: dict[str, Any] = field(default_factory=dict, kw_only=True)

    @property
    def fits(self) -> bool:
        return self.refusal is None

    @property
    def gpus_used(self) -> int:
        """How many of its node's GPUs the plan uses (0 on a CPU): every GPU any stage holds is an index below this,
        so a job given this many GPUs, numbered from 0, runs it as planned."""
        if not self.worker.gpus:
            return 0
        held = [gpu for stage in self.stages for occupant in stage.occupants for gpu in occupant.gpus]
        return 1 + max(held, default=0)

    def require_fit(self) -> None:
        """Raise the refusal as the error a user reads (nothing has run yet)."""
        if self.refusal is not None:
            raise DraftsyncError(
                f"{self.refusal.message()}; no dataset was written and no training started", self.refusal.fix
            )

    def require_visible(self, environ: Mapping[str, str]) -> None:
        """Refuse, before any work, a worker whose CUDA_VISIBLE_DEVICES names fewer GPUs than the plan uses."""
        if self.gpus_used:
            visible_devices(range(self.gpus_used), environ, "the sync's stages")

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
        """Where the target runs: the CPU, one GPU, or a device_map within what each GPU leaves its layers."""
        devices = tuple(self.settings["target_devices"])
        if devices == ("cpu",):
            return TargetPlacement()
        return TargetPlacement(devices, max_memory_gib=self.settings.get("target_max_memory_gib"))

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
            f"| {s.stage} | {s.gpu_gib:.1f} | {_holders(s)} | {s.host_gib:.1f} | {s.disk_gib:.1f} | "
            f"{s.hours_estimate:.2g} | {', '.join(f'{k}={_text(v)}' for k, v in s.settings.items())} |"
            for s in self.stages
        )
        verdict = "fits" if self.fits else f"**refused**: {self.refusal.message()}. Fix: {self.refusal.fix}"  # type: ignore[union-attr]
        why = "".join(f"\n- {choice}: {reason}" for choice, reason in self.reasons.items())
        return (
            f"# Sync plan: {self.target} ({self.parameters / 1e9:.2f}B parameters)\n\n"
            + (f"Target: {self.target_facts['text']}\n\n" if self.target_facts else "")
            + f"Worker: {where}{held}\n\n"
            f"Verdict: {verdict}\n\n| stage | GPU GiB | GPUs held while it runs | host GiB | disk GiB "
            f"| hours (estimate) | settings |\n|---|---|---|---|---|---|---|\n{rows}\n"
            + (f"\nWhy:{why}\n" if why else "")
        )


def _holders(stage: StagePlan) -> str:
    return "; ".join(f"{o.holder}: GPU {','.join(map(str, o.gpus))} x {o.gib:.1f}" for o in stage.occupants) or "-"


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def plan_sync(target: TargetShape, worker: Worker, profile: SyncProfile, responses: int | None = None) -> SyncPlan:
    """The plan for syncing `target` with `profile` on `worker`; `refusal` set when a stage cannot fit.

    `responses`: how many distinct prompts the target answers (None: the profile's generated_samples). The stages are
    planned in the order a sync runs them; each holds its GPUs alone, but for the target an online training keeps.
    Drafter settings the target cannot have are refused first (`check_drafter_settings`)."""
    check_drafter_settings(target, profile)
    responses = profile.generated_samples if responses is None else min(responses, profile.generated_samples)
    settings: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    target_stage, refusals = _TargetStage.plan(target, worker), []
    settings.update(target_stage.settings)
    reasons["target"] = target_stage.reason
    refusals.append(target_stage.refusal)
    server: dict[str, Any] = {}
    if worker.gpus:
        server, server_refusal = server_stage("validation", target, worker, profile)
        refusals.append(server_refusal)
        if server:
            settings["servers"] = server
            reasons["servers"] = server_reason(server, target, target.weight_bytes(on_gpu=True))
    stages = [_responses_stage(target, worker, profile, responses, target_stage, server)] if responses else []
    hidden, hidden_settings, reasons["hidden_states"], disk_refusal = _hidden_states_stage(
        target, worker, profile, dataset_tokens(profile, responses), target_stage
    )
    stages.append(hidden)
    settings.update(hidden_settings)
    refusals.append(disk_refusal)
    online = hidden_settings["hidden_states"] == "online"
    kept = target_stage.occupant("hidden_states: the target, kept for online states") if online else None
    training, training_settings, training_refusal = plan_training(target, worker, profile, kept, online=online)
    stages.append(training)
    settings.update(training_settings)
    refusals.append(training_refusal)
    stages.append(_validation_stage(target, worker, profile, server))
    refusals.append(_host_refusal(stages, worker))
    refusal = next((r for r in refusals if r is not None), None) or overlap_refusal(stages, worker)
    refusal = target.refusal() or refusal  # the sync refuses the target itself: no worker lifts it
    reasons["training"] = _training_reason(settings, worker, profile, target_stage.devices, online)
    settings["trainer"] = profile.trainer
    return SyncPlan(
        target.name,
        target.parameters,
        worker,
        settings,
        tuple(stages),
        refusal=refusal,
        reasons=reasons,
        target_facts=target.description.summary() if target.description is not None else {},
    )


@dataclass(frozen=True)
class _TargetStage:
    """Where the target runs in transformers: one GPU, else a device_map over as many as its weights need, else
    refused; its weights (16-bit, or as quantized) and one forward pass on each of its GPUs."""

    devices: tuple[int, ...]
    per_gpu: float  # bytes of its weights on each of its GPUs
    forward: float  # bytes of one teacher-forced pass
    settings: dict[str, Any]
    reason: str
    refusal: Refusal | None

    @classmethod
    def plan(cls, target: TargetShape, worker: Worker) -> _TargetStage:
        forward = float(forward_bytes(target, FORWARD_TOKENS))
        weights = float(target.weight_bytes(on_gpu=bool(worker.gpus)))
        if not worker.gpus:
            refusal = None
            if weights + forward + HOST_RESERVE_GIB * GiB > worker.host_memory_gib * GiB:
                refusal = Refusal(
                    "hidden_states",
                    f"{gib(weights + forward):.1f} GiB of host memory for the target in fp32 and one forward pass",
                    f"{worker.host_memory_gib:.1f} GiB (with {HOST_RESERVE_GIB:g} GiB kept for the worker itself)",
                    "run the sync on a GPU worker (a target this size needs one), or on a host with more memory",
                )
            settings: dict[str, Any] = {"target_devices": ["cpu"], "target_placement": "cpu", "target_dtype": "float32"}
            return cls((), 0.0, forward, settings, "no GPU on this worker: the target runs on the CPU in fp32", refusal)
        free = worker.freest()
        refusal, devices, room = None, [free[0]], worker.free_gib(free[0]) * GiB
        if weights + forward > room:
            devices, room = [], 0.0  # for the weights: each GPU keeps a forward pass's room beside its layers
            for gpu in free:
                devices.append(gpu)
                room += worker.free_gib(gpu) * GiB - forward
                if room >= weights * DEVICE_MAP_OVERHEAD:
                    break
            if room < weights * DEVICE_MAP_OVERHEAD:
                needed = weights * DEVICE_MAP_OVERHEAD + forward * len(devices)
                refusal = gpu_refusal("hidden_states", needed, worker, room + forward * len(devices))
        need = f"its weights ({size_text(weights / GiB)} GiB on a GPU) and a {FORWARD_TOKENS:,}-token forward pass"
        reason = (
            f"{need} fit GPU {devices[0]}'s {size_text(worker.free_gib(devices[0]))} GiB free"
            if len(devices) == 1
            else f"{need} exceed one GPU's {size_text(worker.free_gib(free[0]))} GiB free: transformers' device_map "
            f"spreads its layers over {len(devices)} GPUs for the teacher-forced pass"
        )
        placed = "one GPU" if len(devices) == 1 else f"device_map over {len(devices)} GPUs"
        settings = {
            "target_devices": [f"cuda:{gpu}" for gpu in sorted(devices)],
            "target_placement": placed if refusal is None else "none: the GPUs cannot hold it",
            "target_dtype": "float16" if target.checkpoint_dtype == "float16" else "bfloat16",
        }
        if len(devices) > 1:  # accelerate's max_memory: what each GPU gives the layers, a forward pass's room kept
            settings["target_max_memory_gib"] = round(min(worker.free_gib(g) for g in devices) - forward / GiB, 1)
        per_gpu = weights * (1.0 if len(devices) == 1 else DEVICE_MAP_OVERHEAD / len(devices))
        return cls(tuple(sorted(devices)), per_gpu, forward, settings, reason, refusal)

    def occupant(self, holder: str, with_forward: bool = False) -> Occupant | None:
        """The target on its GPUs (with a forward pass's memory on each when it runs one); None on a CPU."""
        if not self.devices:
            return None
        return Occupant(holder, self.devices, gib(self.per_gpu + (self.forward if with_forward else 0.0)))


def _responses_stage(
    target: TargetShape,
    worker: Worker,
    profile: SyncProfile,
    responses: int,
    target_stage: _TargetStage,
    server: dict[str, Any],
) -> StagePlan:
    """The target answers the prompts: a vLLM server alone on its GPUs (the transformers target is loaded only after
    it stops), or transformers' generate where the target runs."""
    on_gpu = worker.gpus > 0
    writer = profile.response_writer if profile.response_writer != "auto" else ("vllm" if on_gpu else "hf")
    generated = responses * profile.generated_max_tokens
    settings: dict[str, Any] = {"writer": writer, "responses": responses}
    if on_gpu and writer == "vllm":
        settings.update(server)
        held = server_occupant("responses", server, worker)
        occupants = (held,) if held is not None else ()
        seconds = generated * target.weight_bytes(on_gpu=True) / (GPU_BANDWIDTH * DECODE_BATCH)
    else:
        held = target_stage.occupant("responses: the target (transformers' generate)", with_forward=True)
        occupants = (held,) if held is not None else ()
        throughput = GPU_FLOPS * max(1, len(target_stage.devices)) if on_gpu else CPU_FLOPS
        seconds = (
            generated * 2 * target.compute_parameters / (throughput / 4)
        )  # generate(): a quarter of a pass's throughput
    peak = max((o.gib for o in occupants), default=0.0)
    return StagePlan("responses", peak, 0.0, 0.0, seconds / 3600, settings, occupants)


def _hidden_states_stage(
    target: TargetShape, worker: Worker, profile: SyncProfile, tokens: int, target_stage: _TargetStage
) -> tuple[StagePlan, dict[str, Any], str, Refusal | None]:
    """The target's teacher-forced pass over the dataset: offline (states stored as shards, read every epoch) when
    the disk holds them, else online (tokens stored; the target computes each batch's states during training)."""
    from draftsync.speculative.data import shard_bytes_per_token

    on_gpu = worker.gpus > 0
    reads_aux = METHODS[profile.method].reads_aux_states
    stored_bytes = shard_bytes_per_token(target.hidden, reads_aux)
    online_bytes = shard_bytes_per_token(target.hidden, reads_aux, online=True)
    stored_fits = tokens * stored_bytes <= worker.disk_gib * GiB
    mode = profile.hidden_states if profile.hidden_states != "auto" else ("offline" if stored_fits else "online")
    bytes_per_token = stored_bytes if mode == "offline" else online_bytes
    disk = tokens * bytes_per_token
    # offline: one pass over the dataset; online: a pass over every step's windows (each up to its window's end)
    passed = tokens if mode == "offline" else profile.train_steps * profile.batch_size * profile.seq_len
    throughput = GPU_FLOPS * max(1, len(target_stage.devices)) if on_gpu else CPU_FLOPS
    weights = target.weight_bytes(on_gpu)
    held = target_stage.occupant("hidden_states: the target (transformers)", with_forward=True)
    stage = StagePlan(
        "hidden_states",
        gib(target_stage.per_gpu + target_stage.forward) if on_gpu else 0.0,
        gib(weights + target_stage.forward if not on_gpu else SHARD_TOKENS * bytes_per_token + HOST_WORKING_GIB * GiB),
        gib(disk),
        passed * 2 * target.compute_parameters / throughput / 3600,
        {"mode": mode, "tokens": tokens, "bytes_per_token": bytes_per_token, "forward_tokens": FORWARD_TOKENS},
        (held,) if held is not None else (),
    )
    stored_text = (
        f"{size_text(tokens * stored_bytes / GiB)} GiB of shards ({tokens:,} tokens at {stored_bytes:,} bytes)"
    )
    if mode == "offline":
        reason = (
            f"offline: {stored_text} written once and read every epoch, within the {size_text(worker.disk_gib)} GiB "
            "of disk"
        )
    else:
        why = (
            f"{stored_text} would exceed the {size_text(worker.disk_gib)} GiB of disk"
            if not stored_fits
            else "the profile asks for it"
        )
        reason = (
            f"online: {why}; the target computes each batch's states during training, so the disk holds "
            f"{online_bytes} bytes a token ({size_text(disk / GiB)} GiB) and the target stays loaded beside the trainer"
        )
    refusal = None
    if disk > worker.disk_gib * GiB:
        refusal = Refusal(
            "hidden_states",
            f"{size_text(disk / GiB)} GiB of disk for {tokens:,} tokens of shards at {bytes_per_token:,} bytes each",
            f"{size_text(worker.disk_gib)} GiB free",
            "free disk or give the sync a larger volume (--disk-gb, DRAFTSYNC_DISK_BUDGET_GB), or sync with fewer "
            "training_texts, generated_samples or a shorter dataset_max_seq_len",
        )
    return stage, {"hidden_states": mode}, reason, refusal


def _validation_stage(target: TargetShape, worker: Worker, profile: SyncProfile, server: dict[str, Any]) -> StagePlan:
    """The validation: the target and its drafter in a vLLM server (the reference server on a CPU), after training
    has let its GPUs go."""
    on_gpu = worker.gpus > 0
    check = profile.validation
    low, high = check.gamma_range
    decoded = (check.requests + check.sweep_requests * (high - low + 1) + check.stress_requests) * check.max_tokens
    decoded += check.long_requests * (check.long_max_tokens or check.max_tokens)
    weights = target.weight_bytes(on_gpu)
    # One request at a time: each decoded token reads the weights its experts need, a mixture of experts' share.
    read = weights * target.compute_parameters / target.parameters
    seconds = decoded * (read / GPU_BANDWIDTH if on_gpu else 2 * target.compute_parameters / CPU_FLOPS)
    settings = {"server": "vllm" if on_gpu else "cpu", **server}
    occupant = server_occupant("validation", server, worker)
    occupants = (occupant,) if occupant is not None else ()
    return StagePlan(
        "validation",
        occupant.gib if occupant is not None else 0.0,
        0.0 if on_gpu else gib(weights * 2),
        0.0,
        seconds / 3600,
        settings,
        occupants,
    )


def _host_refusal(stages: list[StagePlan], worker: Worker) -> Refusal | None:
    hungriest = max(stages, key=lambda stage: stage.host_gib)
    if hungriest.host_gib <= worker.host_memory_gib - HOST_RESERVE_GIB:
        return None
    return Refusal(
        hungriest.stage,
        f"{hungriest.host_gib:.1f} GiB of host memory",
        f"{worker.host_memory_gib:.1f} GiB available ({HOST_RESERVE_GIB:g} GiB of it kept for the worker itself)",
        "free host memory or run the sync on a worker with more (--host-memory-gb says what a worker has)",
    )


def _training_reason(
    settings: dict[str, Any], worker: Worker, profile: SyncProfile, target_gpus: tuple[int, ...], online: bool
) -> str:
    processes = settings["train_processes"]
    if profile.trainer == "speculators":
        return (
            f"speculators' trainer (the profile asks): a vLLM server of the target writes the hidden states of the "
            f"dataset's tokens, then `speculators train` runs on {processes} torchrun rank(s); its checkpoint is "
            "imported as the drafter version"
        )
    spans = f" on each of {worker.nodes} nodes (c10d rendezvous; shards on storage every node mounts)"
    holding = (
        "FSDP2 shares AdamW's state out among them, since no step holding it whole fits a GPU"
        if settings["data_parallel"] == "fsdp"
        else "DistributedDataParallel averages the gradients"
    )
    if processes > 1:
        gpus = ",".join(map(str, settings["training_devices"]))
        return (
            f"draftsync's trainer on {processes} torchrun ranks, one per GPU (GPUs {gpus}, the freest that hold a "
            f"step){spans if worker.nodes > 1 else ''}: each trains its slice of every step's {profile.batch_size} "
            f"windows and {holding}"
        )
    beside = (
        f"; online states need the whole target, which runs over {len(target_gpus)} GPUs, so no rank of its own "
        "could hold it"
        if online and len(target_gpus) > 1
        else ""
    )
    return f"draftsync's trainer in one process on {settings['training_device']}{beside}"


def dataset_tokens(profile: SyncProfile, responses: int) -> int:
    """Tokens of the sync's dataset, estimated before the target's tokenizer has read a text: each text at
    AVERAGE_TEXT_TOKENS (cut at dataset_max_seq_len) and each response at its longest, after a PROMPT_TOKENS prompt.
    The dataset task checks the exact count against the disk again before it writes."""
    longest = profile.dataset_max_seq_len or 1 << 30
    texts = profile.training_texts * min(AVERAGE_TEXT_TOKENS, longest)
    return texts + responses * min(PROMPT_TOKENS + profile.generated_max_tokens, longest)
