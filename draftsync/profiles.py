"""Profiles: how hard a sync trains and how much its validation measures, sized for the machine it runs on."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from draftsync.speculative.methods import (
    DEFAULT_METHOD,
    DFLASH_BLOCK_SIZE,
    DFLASH_FAMILY,
    DFLASH_MAX_BLOCK_SIZE,
    METHODS,
    PEAGLE_FAMILY,
    PEAGLE_LONGEST_PROPOSAL,
    PEAGLE_MAX_DRAFT_TOKENS,
    TRAINED_METHODS,
    is_eagle3_family,
)

# What bounds a block drafter's gamma in a sync profile: the field, and the positions one pass holds beyond the tokens
# it drafts (a DFlash block holds the committed token; P-EAGLE's max_draft_tokens counts drafted tokens only).
BLOCK_BOUNDS: dict[str, tuple[str, int]] = {DFLASH_FAMILY: ("block_size", 1), PEAGLE_FAMILY: ("max_draft_tokens", 0)}

# vLLM's draft_sample_method, shared by deployments and the validation profile that measures them (vllm_args.py).
DraftSampling = Literal["greedy", "probabilistic"]
# A profile names every field it sets correctly and holds finite numbers: a typo (`train_step`) or a NaN is refused,
# not ignored.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
# The tasks a target that declares none is synced for: every built-in task, in equal shares.
EVEN_TASK_MIX = {"code": 1 / 3, "math": 1 / 3, "prose": 1 / 3}
MAX_COUNT = 10**9  # steps or samples beyond this are a typo, not a run (1e9 steps is years on any GPU)


EvaluationBackend = Literal["auto", "vllm", "reference"]  # where the checklist is measured


class ValidationProfile(BaseModel):
    """The checklist's load and thresholds. `production` is the production guide's process (1000 requests, 3x QPS,
    outputs over 4K tokens); `demo` scales it to a 2-core CPU; `test` is smaller still."""

    model_config = STRICT

    name: str = "production"
    # Where the checklist is measured: "vllm" serves the pair with real vLLM servers (the engine that will serve
    # it), "reference" runs the CPU reference engine, "auto" takes vLLM whenever an engine is installed.
    backend: EvaluationBackend = "auto"
    requests: int = Field(1000, ge=1)  # the offline validation set, drawn from the task mix
    max_tokens: int = Field(256, ge=2)
    temperature: float = Field(0.0, ge=0.0)  # the deployment's sampling temperature: validate as you serve
    draft_sampling: DraftSampling | None = None  # the deployment's, on vLLM (ServingDeployment)
    gamma_range: tuple[int, int] = (2, 8)  # the sweep, inclusive
    sweep_requests: int = Field(100, ge=1)  # requests per gamma in the sweep (a subset of the validation set)
    knee_tolerance: float = Field(0.02, ge=0.0)  # TPOTs this close to the best count as a tie (-> smaller gamma)
    min_acceptance: float = Field(0.70, ge=0.0, le=1.0)  # pooled validation acceptance must exceed it
    min_p50: float = Field(0.70, ge=0.0, le=1.0)  # per-request acceptance percentiles
    min_p5: float = Field(0.50, ge=0.0, le=1.0)
    min_speedup: float = Field(1.0, ge=0.0)  # TPOT without / with speculation, on the same requests
    qps: float = Field(1.0, gt=0.0)  # the deployment's normal load; the stress test sends stress_factor x this
    stress_factor: float = Field(3.0, ge=1.0)
    stress_requests: int = Field(300, ge=0)  # 0: no stress run (its gates then fail as not measured)
    stress_concurrency: int = Field(8, ge=1)  # clients in flight at most
    # Closed-loop stress at these concurrencies on vLLM (which batches them) gives the per-batch-size gamma schedule,
    # then a relaunch with it is checked against plain decoding; empty, or on the reference server (one request at a
    # time, nothing to learn), none.
    schedule_batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    long_requests: int = Field(20, ge=1)
    long_max_tokens: int | None = Field(4096, ge=2)  # None: the longest the target's context allows
    min_long_acceptance: float = Field(0.50, ge=0.0, le=1.0)
    length_buckets: tuple[int, ...] = (0, 256, 1024, 4096)  # output-length bucket edges for the report
    max_memory_overhead: float = Field(0.15, gt=0.0)  # drafter weights / target weights
    # The served window validation predicts acceptance for, in drafted tokens: the monitor judges a pair's first
    # window this long against the prediction (a shorter one is too noisy to hold to it).
    prediction_window_draft_tokens: int = Field(20_000, ge=1)


VALIDATION_PROFILES = {
    "production": ValidationProfile(),
    # The demo's targets are tiny (24-48 token requests, a context of 1024 tokens, a drafter a fifth of its target's
    # size), so speculation at the knee is about break-even there and two shared cores are noisy: its speed gates
    # catch a clear slowdown only (under 0.8x); bench/speedup.py shows the CPU speedup (docs/VALIDATION.md).
    "demo": ValidationProfile(
        name="demo",
        backend="reference",  # on vLLM each gamma of the sweep is an engine start: minutes more per sync on 2 cores
        min_speedup=0.8,
        requests=16,
        max_tokens=48,
        sweep_requests=6,
        # The source's own acceptance gates (0.70 / 0.70 / 0.50, the defaults): the story's drafters clear them at
        # gamma 2 (docs/TRAINING.md), and a knee whose whole validation set misses one steps down to a smaller gamma.
        stress_requests=8,
        stress_concurrency=4,
        schedule_batch_sizes=(1, 2, 4, 8),  # on vLLM (a CPU's batches)
        # its drafters train two steps ahead (ttt_steps 2); the sweep also measures past that, and down to 1, the gamma
        # a retrain steps down to when its captured traffic clears the monitor's line only there
        gamma_range=(1, 6),
        # Long outputs: four of 256 tokens, five times the demo's requests and twice the 128-token windows its models
        # train on; fewer, longer ones leave the gate to the prompts drawn (docs/VALIDATION.md).
        long_requests=4,
        long_max_tokens=256,
        min_long_acceptance=0.30,
        length_buckets=(0, 64, 256),
        max_memory_overhead=0.60,
        prediction_window_draft_tokens=200,  # a phase of the demo's story drafts a few hundred tokens
    ),
    "test": ValidationProfile(
        name="test",
        backend="reference",  # tests that serve with vLLM ask for it
        min_speedup=0.8,
        requests=6,
        max_tokens=24,
        gamma_range=(2, 4),
        sweep_requests=2,
        min_acceptance=0.55,
        min_p50=0.55,
        min_p5=0.30,
        stress_requests=4,
        stress_concurrency=2,
        schedule_batch_sizes=(),
        long_requests=1,
        long_max_tokens=96,
        min_long_acceptance=0.30,
        length_buckets=(0, 32, 64),
        max_memory_overhead=0.60,
        prediction_window_draft_tokens=100,
    ),
}


def validation_profile(name: str) -> ValidationProfile:
    from draftsync.errors import DraftsyncError

    if name not in VALIDATION_PROFILES:
        raise DraftsyncError(f"unknown validation profile {name!r}", f"use one of {', '.join(VALIDATION_PROFILES)}")
    return VALIDATION_PROFILES[name].model_copy()


class SyncProfile(BaseModel):
    """Knobs of one sync. `production` is sized for a GPU worker and a real target; `demo` fits a 2-core CPU
    in minutes; `test` is smaller still."""

    model_config = STRICT

    name: str = "demo"
    method: str = DEFAULT_METHOD  # one of TRAINED_METHODS (speculative/methods)
    gamma: int = Field(2, ge=1, le=16)
    # The task mix of a target version that declares none (no draftsync.task_mix tag, no draftsync_target.json).
    default_task_mix: dict[str, float] = Field(default_factory=lambda: dict(EVEN_TASK_MIX))
    draft_vocab_size: int = Field(256, ge=16)
    aux_layer_ids: tuple[int, int, int] | None = None  # EAGLE-3 depths; None: low/mid/high of the target
    medusa_heads: int = Field(4, ge=1, le=16)
    # DFlash: positions of one drafted block, the committed token included, so it drafts up to block_size - 1 tokens
    # a step (vLLM sizes its buffers by num_speculative_tokens + 1 and the reference trainers stop at 16); and the
    # token of the block's masked rows (None: the target's pad token, else the last id of its vocabulary).
    block_size: int = Field(DFLASH_BLOCK_SIZE, ge=2, le=DFLASH_MAX_BLOCK_SIZE)
    mask_token_id: int | None = Field(None, ge=0)
    # P-EAGLE: the depths it learns, every one at each training step, so the longest proposal it drafts (vLLM appends
    # num_speculative_tokens - 1 masked slots, at most 16); its masked rows take mask_token_id as DFlash's do.
    max_draft_tokens: int = Field(PEAGLE_MAX_DRAFT_TOKENS, ge=1, le=PEAGLE_LONGEST_PROPOSAL)
    train_steps: int = Field(300, ge=1, le=MAX_COUNT)
    # A warm start from the previous target version's drafter (same method and shapes) needs fewer steps.
    warm_start: bool = True
    warm_start_steps: int = Field(150, ge=1, le=MAX_COUNT)
    checkpoint_every: int = Field(50, ge=0)  # steps between resumable training checkpoints (0: none)
    noise_std: float = Field(0.0, ge=0.0)  # noise on the target states during training
    keep_dataset: bool = False  # shards are large: removed once the drafter is registered (a crashed sync keeps them)
    dataset_max_seq_len: int | None = Field(None, ge=8)  # cut longer samples (None: the target's context)
    batch_size: int = Field(8, ge=1)
    seq_len: int = Field(128, ge=8)
    # A step's windows in micro-batches of at most this many tokens, their gradients accumulated (None: the whole
    # batch at once); `draftsync plan` picks it, and activation checkpointing, when a step would not fit the GPU.
    batch_tokens: int | None = Field(None, ge=8)
    activation_checkpointing: bool = False
    # Data-parallel training processes under torchrun (one per GPU; gloo ranks on a CPU), each on its slice of every
    # step's batch; `draftsync plan` sets it to the worker's GPUs. 1: training in the sync's own process.
    train_processes: int = Field(1, ge=1, le=1024)
    # A training across machines: this many nodes, each running `train_processes` ranks, meet at torchrun's c10d
    # rendezvous on HOST:PORT of the first (where the sync runs); the others run the command the sync logs.
    train_nodes: int = Field(1, ge=1, le=1024)
    train_rendezvous: str | None = None
    # Who trains the drafter: draftsync's own trainer, or `speculators train` under torchrun on the hidden states a
    # vLLM server of the target writes (EAGLE-3 family only; the worker needs speculators and vLLM installed).
    trainer: Literal["draftsync", "speculators"] = "draftsync"
    # How those processes hold the drafter: "ddp" whole on each, "fsdp" (FSDP2) AdamW's state shared out among them
    # for a drafter whose optimiser does not fit one GPU, or "auto": ddp where a step fits (`draftsync plan` decides).
    data_parallel: Literal["auto", "ddp", "fsdp"] = "auto"
    # Where training reads the target's hidden states: "offline" shards written once (8 x hidden + 5 bytes a token
    # for EAGLE-3), "online" from the target per batch (5 bytes a token on disk, a forward pass a batch), or "auto":
    # offline where the shards fit the disk, else online (`draftsync plan` decides and says why).
    hidden_states: Literal["auto", "offline", "online"] = "auto"
    # Who writes offline hidden states: "vllm" (a server with the extract_hidden_states speculative method, vLLM >=
    # 0.18, data-parallel over every GPU), "transformers" (one GPU, or a device_map), or "auto": vLLM on a GPU worker
    # whose vLLM has the method, else transformers (`draftsync plan` decides and says why).
    hidden_states_engine: Literal["auto", "vllm", "transformers"] = "auto"
    # A retrain of a deployment's stale drafter answers prompts of its captured traffic (serving/traffic_capture.py)
    # for this share of the dataset's sequences (texts and responses), as far as its distinct captured prompts go; the
    # declared task mix makes up the rest, shrunk to keep the share; with fewer than
    # `min_captured_prompts` captured it says so and trains on the declared mix alone.
    captured_share: float = Field(0.5, ge=0.0, le=1.0)
    min_captured_prompts: int = Field(20, ge=1)
    # Each captured prompt's openings answered too (`tasks.dataset.captured_openings`): this many per prompt.
    captured_openings: int = Field(0, ge=0, le=8)
    # This share of the captured prompts is held out of the retrain's data and validated on, beside the declared mix.
    captured_holdout: float = Field(0.2, ge=0.0, lt=1.0)
    lr: float = Field(2e-3, gt=0.0)
    warmup_steps: int = Field(10, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)  # the cosine decay ends at lr * min_lr_ratio
    ttt_steps: int = Field(2, ge=1)  # training-time test: later draft positions need it
    position_decay: float = Field(1.0, gt=0.0, le=1.0)  # draft position k's loss weighs position_decay**k
    # Below 1 the drafter learns the target's distribution sharpened towards its greedy token, for deployments served
    # at T=0; no profile sets it, as its gain has not held on served traffic (docs/TRAINING.md).
    teacher_temperature: float = Field(1.0, gt=0.0)
    training_texts: int = Field(800, ge=10, le=MAX_COUNT)
    generated_samples: int = Field(400, ge=0, le=MAX_COUNT)  # prompts the target answers itself (its own outputs)
    generated_max_tokens: int = Field(96, ge=1)
    # Who writes those responses: "vllm" (one plain server, many requests batched: how 50K-100K are written),
    # "hf" (transformers' generate, 32 prompts a batch, no engine needed), "auto": vLLM when an engine is installed.
    response_writer: Literal["auto", "vllm", "hf"] = "auto"
    # The checklist the drafter must pass. The production guide's thresholds (0.70 mean and P50, 0.50 P5) are the
    # production profile's; the tiny CPU targets of the demo reach about 0.6-0.75, so its profile gates lower.
    validation: ValidationProfile = Field(default_factory=lambda: VALIDATION_PROFILES["production"].model_copy())
    seed: int = 0
    training_device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")  # `draftsync plan` picks the GPU
    # Train the method and sweep the gamma range the decision framework recommends for the target and its
    # hardware (`draftsync recommend`); off, the recommendation is only recorded on the drafter version.
    follow_recommendation: bool = False

    @field_validator("method")
    @classmethod
    def _a_trained_method(cls, method: str) -> str:
        if method not in TRAINED_METHODS:
            raise ValueError(f"method {method!r} is not one a sync trains: use one of {', '.join(TRAINED_METHODS)}")
        return method

    @model_validator(mode="after")
    def _speculators_trains_eagle3(self) -> SyncProfile:
        if self.trainer == "speculators" and not is_eagle3_family(self.method):
            raise ValueError(f"trainer speculators trains EAGLE-3 drafters, not {self.method}: use trainer draftsync")
        return self

    @model_validator(mode="after")
    def _gamma_within_the_block(self) -> SyncProfile:
        """A block drafter is saved for its gamma and swept from the range's low end: both within what one pass
        drafts (DFlash: block_size - 1 after the committed token; P-EAGLE: the max_draft_tokens depths it learns)."""
        family = METHODS[self.method].family
        if family not in BLOCK_BOUNDS:
            return self
        knob, held = BLOCK_BOUNDS[family]
        most, needed = getattr(self, knob) - held, self.gamma + held
        drafter = f"{self.method} {'block' if held else 'drafter'} of {knob} {getattr(self, knob)}"
        if self.gamma > most:
            raise ValueError(
                f"gamma {self.gamma} is more than a {drafter} drafts ({most}): use gamma <= {most} or "
                f"{knob} >= {needed}"
            )
        if self.validation.gamma_range[0] > most:
            raise ValueError(
                f"validation.gamma_range {list(self.validation.gamma_range)} starts above the {most} tokens a "
                f"{drafter} drafts: lower its start or raise {knob}"
            )
        return self

    @model_validator(mode="after")
    def _nodes_meet_somewhere(self) -> SyncProfile:
        if self.train_nodes > 1 and not self.train_rendezvous:
            raise ValueError(
                f"train_nodes {self.train_nodes} needs train_rendezvous: HOST:PORT of the first node (c10d rendezvous)"
            )
        if self.train_rendezvous is not None and host_and_port(self.train_rendezvous) is None:
            raise ValueError(f"train_rendezvous {self.train_rendezvous!r} is not HOST:PORT, e.g. node-0:29400")
        return self

    def dataset_key(self) -> str:
        """What the dataset depends on: a rerun with the same key resumes it, another key builds anew."""
        import hashlib

        fields = (
            "training_texts",
            "generated_samples",
            "generated_max_tokens",
            "response_writer",
            "seed",
            "aux_layer_ids",
            "dataset_max_seq_len",
        )
        data = [getattr(self, f) for f in fields] + [METHODS[self.method].reads_aux_states]
        if self.hidden_states_engine == "vllm":  # its states differ by rounding: never resumed into another's build
            data.append("vllm")
        return hashlib.sha256(repr(data).encode()).hexdigest()[:12]


PROFILES = {
    # A GPU worker and a real target: the production guide's 50K-100K samples the target writes itself, a draft
    # vocabulary of 32K, as many training-time-test steps as the gamma it serves (fewer leave the last draft positions
    # untrained: bench/drafter_quality.py, docs/TRAINING.md), the production checklist.
    "production": SyncProfile(
        name="production",
        gamma=4,
        draft_vocab_size=32000,
        train_steps=20000,
        warm_start_steps=8000,
        checkpoint_every=1000,
        noise_std=0.05,
        batch_size=16,
        seq_len=2048,
        lr=3e-4,
        ttt_steps=4,
        training_texts=50000,
        generated_samples=50000,
        generated_max_tokens=1024,
        follow_recommendation=True,
        validation=VALIDATION_PROFILES["production"],
    ),
    # The demo keeps the HF loop: for its 400 responses of up to 96 tokens an engine start does not pay
    # (bench/responses.py, 2 quiet cores: the loop 12.4 s; vLLM 12.2 s after a 36.4 s start; docs/TRAINING.md).
    # A retrain also answers four openings of each captured prompt: on the demo's drifted prose, paired against none
    # (same data and seeds), held-out acceptance rose 0.773 -> 0.806 at gamma 2 and its P5 0.46 -> 0.63.
    "demo": SyncProfile(response_writer="hf", captured_openings=4, validation=VALIDATION_PROFILES["demo"]),
    "test": SyncProfile(
        name="test",
        draft_vocab_size=256,
        train_steps=600,
        warm_start_steps=300,
        batch_size=8,
        seq_len=96,
        training_texts=400,
        generated_samples=160,
        generated_max_tokens=48,
        response_writer="hf",  # tests that write responses with vLLM ask for it
        validation=VALIDATION_PROFILES["test"],
    ),
}


def host_and_port(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of a HOST:PORT endpoint such as a torchrun rendezvous; None when it is not one."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def profile(name: str) -> SyncProfile:
    """A named profile, or one read from a YAML/JSON file (its fields override the demo profile's)."""
    from draftsync.errors import DraftsyncError

    if name.endswith((".yaml", ".yml", ".json")) or (name not in PROFILES and os.path.lexists(name)):
        return _profile_file(name)
    if name not in PROFILES:
        raise DraftsyncError(
            f"unknown sync profile {name!r}",
            f"use one of {', '.join(PROFILES)}, or the path of a YAML/JSON profile file",
        )
    return PROFILES[name].model_copy()


def _profile_file(path: str) -> SyncProfile:
    from pathlib import Path

    from draftsync.errors import DraftsyncError
    from draftsync.user_files import read_yaml

    fields = read_yaml(Path(path), "sync profile file", "give a readable YAML or JSON file of SyncProfile fields")
    if fields is None:
        raise DraftsyncError(
            f"sync profile file {path} holds no fields",
            "write the fields that differ from the demo profile, e.g. `train_steps: 2000`, or use --profile demo",
        )
    if not isinstance(fields, dict):
        raise DraftsyncError(
            f"sync profile file {path} is not a mapping of fields",
            "write fields such as `method: eagle3` and `train_steps: 2000`, one per line",
        )
    base = PROFILES["demo"].model_dump()
    section = fields.pop("validation", None)
    section = {} if section is None else section  # `validation:` left empty
    if not isinstance(section, dict):
        raise DraftsyncError(
            f"sync profile file {path}: validation is {type(section).__name__} {section!r}, not a section of fields",
            "write validation as a mapping, e.g. `validation: {requests: 200, min_acceptance: 0.6}`",
        )
    validation = {**base.pop("validation"), **section}
    return _validated(
        {**base, "name": Path(path).stem, **fields, "validation": validation},
        f"sync profile file {path}",
        "fix that field (see SyncProfile and ValidationProfile in draftsync/profiles.py)",
    )


def with_changes(chosen: SyncProfile, where: str, **changes: object) -> SyncProfile:
    """`chosen` with `changes` (e.g. a command's options), checked as a profile read from a file is: a value no sync
    can run with is refused here, before any work, naming `where` it came from and the field."""
    return _validated(
        {**chosen.model_dump(), **changes}, where, "change that option, or the profile field it overrides"
    )


def _validated(fields: dict, where: str, fix: str) -> SyncProfile:
    from pydantic import ValidationError

    from draftsync.errors import DraftsyncError

    try:
        return SyncProfile.model_validate(fields)
    except ValidationError as error:
        problem = error.errors()[0]
        field = ".".join(str(part) for part in problem["loc"])  # none for a check across fields
        raise DraftsyncError(f"{where}: {field + ': ' if field else ''}{problem['msg']}", fix) from error
