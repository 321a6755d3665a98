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

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.planning.servers import (
    plan_server,
    replica_groups,
    server_bytes,
    server_occupant,
    server_reason,
    server_stage,
)
from draftsync.planning.stages import Occupant, Refusal, StagePlan, gpu_refusal, overlap_refusal
from draftsync.planning.target_shape import TargetShape, forward_bytes
from draftsync.planning.training_plan import (
    CPU_FLOPS,
    GPU_FLOPS,
    HOST_WORKING_GIB,
    check_drafter_settings,
    plan_training,
)
from draftsync.planning.worker import (
    EXTRACT_HIDDEN_STATES_SINCE,
    HOST_RESERVE_GIB,
    GiB,
    Worker,
    gib,
    size_text,
    vllm_release,
)
from draftsync.profiles import SyncProfile
from draftsync.records import record_dict
from draftsync.speculative.methods import METHODS, MTP
from draftsync.speculative.placement import TargetPlacement, visible_devices

DEVICE_MAP_OVERHEAD = 1.10  # accelerate's device_map does not split layers evenly: a tenth more than the weights
FORWARD_TOKENS = 8192  # tokens of one teacher-forced pass (the shard writer's max_batch_tokens)
SHARD_TOKENS = 65536  # tokens the shard writer buffers in host memory before it writes a shard
GPU_BANDWIDTH = 0.6 * 3.35e12  # decoding on an H100-class GPU at 60% of its memory bandwidth (assumed)
DECODE_BATCH = 64  # sequences a response server decodes at once
AVERAGE_TEXT_TOKENS = 512  # a training text of the built-in corpora, in a Llama-3-class tokenizer (assumed)
PROMPT_TOKENS = 64
STATE_BYTES = 2  # a hidden state's element in a shard and in vLLM's cache (bf16)
DISK_WRITE_BYTES_S = 2e9  # shards written at 2 GB/s, a local NVMe's sustained rate (assumed)
SERVER_START_S = 180.0  # a vLLM server start on a GPU worker: weights loaded, graphs captured (assumed)
VALIDATION_GOAL_HOURS = 1.0  # what the validation is sized for; a plan that cannot meet it says why


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

    @property
    def gpus_needed(self) -> int:
        """The fewest of its node's GPUs, numbered from 0, that run the plan: its servers at one replica each. What a
        sync asks a pool for, so a small sync leaves the rest of a node to others; a worker with more GPUs gives its
        servers more replicas."""
        if not self.worker.gpus:
            return 0
        held = [gpu for stage in self.stages for occupant in stage.occupants for gpu in occupant.least_gpus()]
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
            "hidden_states_engine": self.settings["hidden_states_engine"],
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
        estimates = "".join(f"\n- {s.stage}: {s.assumptions}" for s in self.stages if s.assumptions)
        return (
            f"# Sync plan: {self.target} ({self.parameters / 1e9:.2f}B parameters)\n\n"
            + (f"Target: {self.target_facts['text']}\n\n" if self.target_facts else "")
            + f"Worker: {where}{held}\n\n"
            f"Verdict: {verdict}\n\n| stage | GPU GiB | GPUs held while it runs | host GiB | disk GiB "
            f"| hours (estimate) | settings |\n|---|---|---|---|---|---|---|\n{rows}\n"
            + (f"\nWhy:{why}\n" if why else "")
            + (f"\nEstimates (assumed throughputs, not measurements):{estimates}\n" if estimates else "")
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
    head = target.mtp_head
    if head is not None:  # its drafter is the head it ships: the stages size a refresh of it
        profile = profile.model_copy(update={"method": MTP.name})
    check_drafter_settings(target, profile)
    responses = profile.generated_samples if responses is None else min(responses, profile.generated_samples)
    settings: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    target_stage, refusals = _TargetStage.plan(target, worker), []
    settings.update(target_stage.settings)
    reasons["target"] = target_stage.reason
    server: dict[str, Any] = {}
    if worker.gpus:
        server, server_refusal = server_stage("validation", target, worker, profile)
        refusals.append(server_refusal)
        if server:
            settings["servers"] = server
            reasons["servers"] = server_reason(server, target, target.weight_bytes(on_gpu=True))
    stages = [_responses_stage(target, worker, profile, responses, target_stage, server)] if responses else []
    hidden = _hidden_states_stage(target, worker, profile, dataset_tokens(profile, responses), target_stage)
    stages.append(hidden.stage)
    settings.update(hidden.settings)
    reasons["hidden_states"], reasons["hidden_states_engine"] = hidden.reason, hidden.engine_reason
    refusals.extend(hidden.refusals)
    online = hidden.settings["hidden_states"] == "online"
    hf_responses = bool(responses) and stages[0].settings["writer"] == "hf"
    if hidden.settings["hidden_states_engine"] == "transformers" or hf_responses:  # the transformers target loads
        refusals.insert(0, target_stage.refusal)
    kept = target_stage.occupant("hidden_states: the target, kept for online states") if online else None
    training, training_settings, training_refusal = plan_training(target, worker, profile, kept, online=online)
    stages.append(training)
    settings.update(training_settings)
    refusals.append(training_refusal)
    validation, validation_settings, reasons["validation"] = _validation_stage(target, worker, profile, server)
    stages.append(validation)
    settings.update(validation_settings)
    refusals.append(_host_refusal(stages, worker))
    refusal = next((r for r in refusals if r is not None), None) or overlap_refusal(stages, worker)
    if head is not None:
        reasons["mtp_head"] = _mtp_head_reason(target, training, refusal)
        refusal = refusal or _mtp_refresh_refusal(target)
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
    """The target answers the prompts: a vLLM server alone on its GPUs, its data-parallel replicas over every GPU
    that holds one (the transformers target is loaded only after it stops), or transformers' generate where the
    target runs."""
    on_gpu = worker.gpus > 0
    writer = profile.response_writer if profile.response_writer != "auto" else ("vllm" if on_gpu else "hf")
    generated = responses * profile.generated_max_tokens
    settings: dict[str, Any] = {"writer": writer, "responses": responses}
    if on_gpu and writer == "vllm":
        settings.update(server)
        held = server_occupant("responses", server, worker)
        occupants = (held,) if held is not None else ()
        # a decoding step of a replica reads its share of the weights on each of its GPUs for DECODE_BATCH tokens
        size, replicas = server.get("tensor_parallel_size", 1), server.get("data_parallel_size", 1)
        lanes = size * replicas * DECODE_BATCH
        seconds = generated * target.weight_bytes(on_gpu=True) / (GPU_BANDWIDTH * lanes)
        assumptions = (
            f"{generated:,} tokens ({responses:,} x {profile.generated_max_tokens}), {DECODE_BATCH} decoded a step "
            f"by each of {replicas} replica(s), a step reading the "
            f"{size_text(target.weight_bytes(on_gpu=True) / GiB)} GiB of weights split over "
            f"{size} GPU(s) at {GPU_BANDWIDTH / 1e12:.2f} TB/s each"
        )
    else:
        held = target_stage.occupant("responses: the target (transformers' generate)", with_forward=True)
        occupants = (held,) if held is not None else ()
        throughput = GPU_FLOPS if on_gpu else CPU_FLOPS  # a device_map runs one GPU's layers at a time
        seconds = generated * 2 * target.compute_parameters / (throughput / 4)
        assumptions = (
            f"{generated:,} tokens ({responses:,} x {profile.generated_max_tokens}) x 2 x "
            f"{target.compute_parameters / 1e9:.2g}B parameters at a quarter of {throughput / 1e12:g} TFLOP/s "
            f"(transformers' generate on {'one GPU at a time' if on_gpu else 'the CPU'})"
        )
    peak = max((o.gib for o in occupants), default=0.0)
    return StagePlan("responses", peak, 0.0, 0.0, seconds / 3600, settings, occupants, assumptions)


@dataclass(frozen=True)
class _HiddenStates:
    """The hidden-states stage, the settings it hands the sync, why (mode and engine) and what refuses it."""

    stage: StagePlan
    settings: dict[str, Any]
    reason: str
    engine_reason: str
    refusals: tuple[Refusal | None, ...]


def _hidden_states_stage(
    target: TargetShape, worker: Worker, profile: SyncProfile, tokens: int, target_stage: _TargetStage
) -> _HiddenStates:
    """The target's teacher-forced pass over the dataset: offline (states stored as shards, read every epoch) when
    the disk holds them, else online (tokens stored; the target computes each batch's states during training).
    Offline, a vLLM server with the `extract_hidden_states` method writes them where the worker has one (data-parallel
    replicas over every GPU), else transformers (one GPU, or a device_map with one GPU busy at a time)."""
    from draftsync.speculative.data import shard_bytes_per_token
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids
    from draftsync.speculative.data.vllm_connector import captured_layer_ids

    on_gpu = worker.gpus > 0
    reads_aux = METHODS[profile.method].reads_aux_states
    aux_layers = 1 if target.mtp_head is not None else 3  # an MTP head reads one state of the target
    stored_bytes = shard_bytes_per_token(target.hidden, reads_aux, aux_layers=aux_layers)
    online_bytes = shard_bytes_per_token(target.hidden, reads_aux, online=True)
    stored_fits = tokens * stored_bytes <= worker.disk_gib * GiB
    mode = profile.hidden_states if profile.hidden_states != "auto" else ("offline" if stored_fits else "online")
    bytes_per_token = stored_bytes if mode == "offline" else online_bytes
    disk = tokens * bytes_per_token
    # offline: one pass over the dataset; online: a pass over every step's windows (each up to its window's end)
    passed = tokens if mode == "offline" else profile.train_steps * profile.batch_size * profile.seq_len
    aux = (profile.aux_layer_ids or default_aux_layer_ids(target.layers)) if reads_aux else ()
    layer_ids = list(captured_layer_ids(aux, target.layers))  # and the last layer's output, before the final norm
    longest = min(profile.dataset_max_seq_len or target.context or 1 << 30, target.context or 1 << 30)
    states = len(layer_ids) * target.hidden * STATE_BYTES
    server = (
        plan_server(target, worker, profile, context=longest, drafter=False, states_per_token=states)
        if on_gpu
        else None
    )
    engine, engine_reason, engine_refusal = _engine_choice(target, worker, profile, mode, server, layer_ids, longest)
    written = f"; {size_text(disk / GiB)} GiB written at {DISK_WRITE_BYTES_S / 1e9:g} GB/s" if disk else ""
    flops = passed * 2 * target.compute_parameters
    stage_settings: dict[str, Any] = {"mode": mode, "engine": engine, "tokens": tokens}
    stage_settings["bytes_per_token"] = bytes_per_token
    host = gib(SHARD_TOKENS * bytes_per_token + HOST_WORKING_GIB * GiB)
    if engine == "vllm" and server is not None:
        gpus = server["tensor_parallel_size"] * server["data_parallel_size"]
        compute = flops / (GPU_FLOPS * gpus)
        held = server_occupant("hidden_states", server, worker)
        occupants: tuple[Occupant, ...] = (held,) if held is not None else ()
        gpu_gib = held.gib if held is not None else 0.0
        stage_settings.update(server)
        assumed = f"{gpus} GPU(s) prefilling at {GPU_FLOPS / 1e12:.0f} TFLOP/s each"
    else:
        busy = 1 if on_gpu else 0  # a device_map runs one GPU's layers at a time
        compute = flops / (GPU_FLOPS if on_gpu else CPU_FLOPS)
        target_held = target_stage.occupant("hidden_states: the target (transformers)", with_forward=True)
        occupants = (target_held,) if target_held is not None else ()
        gpu_gib = gib(target_stage.per_gpu + target_stage.forward) if on_gpu else 0.0
        if not on_gpu:
            host = gib(target.weight_bytes(False) + target_stage.forward)
        stage_settings["forward_tokens"] = FORWARD_TOKENS
        assumed = (
            f"{busy} GPU busy at a time at {GPU_FLOPS / 1e12:.0f} TFLOP/s"
            if on_gpu
            else f"the CPU at {CPU_FLOPS / 1e12:g} TFLOP/s"
        )
    seconds = max(compute, disk / DISK_WRITE_BYTES_S)
    assumptions = (
        f"{passed:,} tokens x 2 x {target.compute_parameters / 1e9:.1f}B parameters = {flops:.3g} FLOPs on {assumed} "
        f"({compute / 3600:.2g} h){written} ({disk / DISK_WRITE_BYTES_S / 3600:.2g} h); the longer of the two"
    )
    stage = StagePlan("hidden_states", gpu_gib, host, gib(disk), seconds / 3600, stage_settings, occupants, assumptions)
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
    settings: dict[str, Any] = {"hidden_states": mode, "hidden_states_engine": engine}
    if engine == "vllm" and server is not None:
        settings["hidden_states_server"] = server
        settings["hidden_states_layer_ids"] = layer_ids
    return _HiddenStates(stage, settings, reason, engine_reason, (engine_refusal, refusal))


def _engine_choice(
    target: TargetShape,
    worker: Worker,
    profile: SyncProfile,
    mode: str,
    server: dict[str, Any] | None,
    layer_ids: list[int],
    longest: int,
) -> tuple[str, str, Refusal | None]:
    """Who writes the hidden states, why, and the refusal of what the profile asks and the worker cannot give: vLLM
    where its version has `extract_hidden_states` and a server fits (auto: on a GPU worker), else transformers."""
    asked, version = profile.hidden_states_engine, worker.vllm_version
    states = len(layer_ids) * target.hidden * STATE_BYTES
    since = ".".join(map(str, EXTRACT_HIDDEN_STATES_SINCE))
    release = vllm_release(version) if version is not None else None
    switch = "or set hidden_states_engine: transformers (or auto) in the sync profile"
    if version is not None and release is None:
        return (
            "transformers",
            f"vLLM version {version!r} is not a release number",
            Refusal(
                "hidden_states",
                f"a vLLM release number to tell whether its servers have extract_hidden_states (since {since})",
                f"vLLM version {version!r}",
                "give the worker's vLLM version as MAJOR.MINOR.PATCH, e.g. --vllm-version 0.32.0 (none: no vLLM)",
            ),
        )
    if asked == "transformers":
        return "transformers", "transformers: the profile asks for it (hidden_states_engine: transformers)", None
    refusal: Refusal | None = None
    too_old = release is not None and release < EXTRACT_HIDDEN_STATES_SINCE
    if mode == "online" and (asked != "vllm" or version is None or too_old):
        why = "online states are computed by the trainer's own target, batch by batch (auto asks no server for them)"
        if asked == "vllm":
            refusal = Refusal(
                "hidden_states",
                f"a vLLM with the extract_hidden_states speculative method (>= {since}) to answer each batch's "
                "states online: the profile asks for hidden_states_engine vllm",
                f"vLLM {version}" if version is not None else "no vLLM",
                f"install vLLM >= {since} on the worker (the official image; `make vllm` on a CPU), " + switch,
            )
    elif mode == "online":
        return (
            "vllm",
            f"vLLM {version}, online: the trainer asks one vLLM server for the states of each batch it is about to "
            "train on and writes no shards; the server stays up through training (the profile asks for it)",
            None,
        )
    elif version is None:
        why = "this worker has no vLLM"
        if asked == "vllm":
            refusal = Refusal(
                "hidden_states",
                f"a vLLM with the extract_hidden_states speculative method (>= {since}): the profile asks for "
                "hidden_states_engine vllm",
                "no vLLM",
                f"install vLLM >= {since} on the worker (the official image; `make vllm` on a CPU), " + switch,
            )
    elif release is not None and release < EXTRACT_HIDDEN_STATES_SINCE:
        why = f"vLLM {version} has no extract_hidden_states speculative method (vLLM has it since {since})"
        if asked == "vllm":
            refusal = Refusal(
                "hidden_states",
                f"vLLM >= {since} for the extract_hidden_states speculative method",
                f"vLLM {version}",
                f"upgrade vLLM on the worker to {since} or later, " + switch,
            )
    elif not worker.gpus and asked == "auto":
        why = (
            "no GPU: auto takes vLLM on GPU workers only, as a CPU engine start (21-38 s on 2 cores) costs more than a "
            "small target's pass (hidden_states_engine: vllm asks for it)"
        )
    elif worker.gpus and server is None:
        needed = server_bytes(target, profile, 1, context=longest, drafter=False, states_per_token=states)
        why = f"no vLLM server of {size_text(needed / GiB)} GiB (at tensor parallelism 1) fits these GPUs"
        if asked == "vllm":
            refusal = Refusal(
                "hidden_states",
                f"{size_text(needed / GiB)} GiB of GPU memory for a vLLM server of the target (weights, one "
                f"{longest:,}-token sequence's KV cache and {states:,} bytes of states a token)",
                f"{size_text(worker.free_gib(0))} GiB free on {worker.gpus} x {worker.gpu_memory_gib:.0f} GiB",
                "give the sync a worker with more or larger GPUs, a shorter dataset_max_seq_len, " + switch,
            )
    else:
        if server is None:  # a CPU worker asked for vLLM: its server is the CPU build's
            return "vllm", f"vLLM {version}: the profile asks for it on this CPU (hidden_states_engine: vllm)", None
        replicas, size = server["data_parallel_size"], server["tensor_parallel_size"]
        return (
            "vllm",
            f"vLLM {version} (extract_hidden_states since {since}, its states written by draftsync's hidden-states KV "
            f"connector): {replicas} data-parallel replica(s) at tensor parallelism {size} prefill on "
            f"{replicas * size} GPU(s) at once, where transformers' device_map runs one GPU's layers at a time; each "
            f"replica is sized for one {longest:,}-token sequence (the dataset's longest) with its KV cache and "
            f"{states:,} bytes of states a token (layers {','.join(map(str, layer_ids))})",
            None,
        )
    return "transformers", f"transformers: {why}", refusal


def _validation_stage(
    target: TargetShape, worker: Worker, profile: SyncProfile, server: dict[str, Any]
) -> tuple[StagePlan, dict[str, Any], str]:
    """The validation: the target and its drafter in a vLLM server with a data-parallel replica a group of GPUs, the
    checklist's requests as many at a time as replicas, so each still decodes alone (the reference server on a CPU),
    after training has let its GPUs go. The work is the
    runner's: the sweep (one server a gamma), the validation set at the knee and the long outputs, the plain
    twin of the set, and stress (open loop and each batch size's closed loop, speculative and plain, then the
    schedule's relaunch); each request one at a time unless stress batches it, a step costing one token's weight
    reads; speculative tokens timed at the checklist's min_speedup (a drafter that passes is no slower)."""
    on_gpu = worker.gpus > 0
    check = profile.validation
    low, high = check.gamma_range
    gammas = high - low + 1
    groups = replica_groups(server) if server else []
    servers = max(1, len(groups))
    size = int(server.get("tensor_parallel_size", 1)) if server else 1
    weights = target.weight_bytes(on_gpu)
    # Each decoded token reads the weights its experts need (a mixture of experts' share), split over the TP GPUs.
    read = weights * target.compute_parameters / target.parameters
    step = read / (GPU_BANDWIDTH * size) if on_gpu else 2 * target.compute_parameters / CPU_FLOPS
    speedup = max(1.0, check.min_speedup)
    sweep = gammas * check.sweep_requests * check.max_tokens
    long_tokens = check.long_requests * (check.long_max_tokens or target.context or check.max_tokens)
    knee = (check.requests - min(check.sweep_requests, check.requests)) * check.max_tokens + long_tokens
    plain = check.requests * check.max_tokens
    sizes = check.schedule_batch_sizes if on_gpu else ()  # the reference server has no schedule to learn
    opened = check.stress_requests * check.max_tokens / check.stress_concurrency if check.stress_requests else 0.0
    levels = sum(max(check.stress_requests, 2 * b) * check.max_tokens / b for b in sizes) if opened else 0.0
    speculative = sweep + knee + opened + 2 * levels  # the schedule's relaunch runs the levels again
    unsped = plain + opened + levels
    starts = (math.ceil(gammas / servers) + 1 + (1 if opened else 0) + (1 if levels else 0)) if on_gpu else 0
    work = speculative / speedup + unsped
    seconds = starts * SERVER_START_S + work * step / servers
    listed = "; ".join(",".join(map(str, group)) for group in groups)
    where = (
        f"{servers} data-parallel replica(s) at tensor parallelism {size} (GPUs {listed})"
        if on_gpu
        else "the CPU reference server"
    )
    per_step = (
        f"{size_text(read / GiB)} GiB of weights read over {size} GPU(s) at {GPU_BANDWIDTH / 1e12:.2f} TB/s each"
        if on_gpu
        else f"2 x {target.compute_parameters / 1e9:.2g}B FLOPs at {CPU_FLOPS / 1e12:g} TFLOP/s"
    )
    assumptions = (
        f"{work:,.0f} decoding steps: sweep {gammas} gammas x {check.sweep_requests} x {check.max_tokens} = "
        f"{sweep:,}, knee set and long outputs {knee:,}, plain twin {plain:,}, stress {opened:,.0f} open-loop and "
        f"{levels:,.0f} closed-loop at batch sizes {list(sizes)} a run (speculative, plain, the schedule's relaunch); "
        f"speculative ones at {speedup:g}x (min_speedup); a step {step * 1000:.1f} ms ({per_step}); shared by "
        f"{where}; {starts} server start(s) at {SERVER_START_S:.0f} s"
    )
    hours = seconds / 3600
    reason = (
        f"one vLLM server with {servers} data-parallel replica(s), the checklist's requests {servers} at a time (one a "
        f"replica, so each decodes alone, as TPOT is measured): {hours:.2g} h"
    )
    if on_gpu and hours > VALIDATION_GOAL_HOURS:
        steps_left = max(0.0, (VALIDATION_GOAL_HOURS * 3600 - starts * SERVER_START_S) * servers / step)
        reason += (
            f"; over the {VALIDATION_GOAL_HOURS:g} h goal: each replica decodes one request at a time (TPOT is "
            f"measured unbatched), and every GPU already holds a replica; under it these replicas decode about "
            f"{steps_left:,.0f} steps, so lower validation.requests, stress_requests, schedule_batch_sizes or "
            "long_requests in the profile to fit"
        )
    settings = {"server": "vllm" if on_gpu else "cpu", **server}
    occupant = server_occupant("validation", server, worker)
    occupants = (occupant,) if occupant is not None else ()
    stage = StagePlan(
        "validation",
        occupant.gib if occupant is not None else 0.0,
        0.0 if on_gpu else gib(weights * 2),
        0.0,
        hours,
        settings,
        occupants,
        assumptions,
    )
    return stage, {}, reason


def _mtp_head_reason(target: TargetShape, training: StagePlan, memory_refusal: Refusal | None) -> str:
    """The head it ships, and what refreshing it takes: the stages above are that refresh (the head's layer trained
    on the target's own states and responses, the trunk frozen), served with vLLM's method mtp."""
    head = target.mtp_head
    assert head is not None
    served = head.summary()["served_layers"]
    verdict = "fit" if memory_refusal is None else f"do not fit: {memory_refusal.message()}"
    return (
        f"the target ships its own {head.layout.family} MTP head: {head.layers} layer(s), vLLM serves {served}, "
        f"{target.mtp_head_parameters() / 1e9:.2f}B parameters, {target.mtp_head_bytes() / GiB:.2f} GiB as stored. "
        "The stages above size a refresh of it (its layer trained on the target's own states and responses, the "
        f"trunk frozen, served with --speculative-config method mtp): {training.gpu_gib or training.host_gib:.1f} "
        "GiB for its training step (its weights, gradients and AdamW in fp32, the target's embedding and lm_head, "
        f"one window's activations); on this worker its stages {verdict}"
    )


def _mtp_refresh_refusal(target: TargetShape) -> Refusal | None:
    """A head of a family draftsync has no trainer for: its refresh is refused."""
    head = target.mtp_head
    if head is None or head.layout.refreshed_here:
        return None
    return Refusal(
        "training",
        "",
        "",
        "serve the target with its head as shipped (method mtp); the plan sizes the refresh a trainer for its "
        "family would run",
        reason=f"draftsync refreshes MiMo-style MTP heads only, not a {head.layout.family} one",
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
