"""How to train one drafter (`TrainConfig`) and what a checkpoint must agree with to resume (its fingerprint)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import DEFAULT_METHOD, DFLASH_FAMILY, METHODS, PEAGLE_FAMILY, is_eagle3_family
from draftsync.speculative.train.data_parallel import DDP, REPLICAS

if TYPE_CHECKING:
    from draftsync.profiles import SyncProfile

# TrainConfig fields added after the fingerprint was first written (see TrainConfig.fingerprint).
FIELDS_ADDED_LATER = (
    "min_lr_ratio",
    "position_decay",
    "ttt_feed",
    "teacher_temperature",
    "block_size",
    "mask_token_id",
    "max_draft_tokens",
)
# How a step is laid out in memory, not what it computes: a checkpoint resumes across them.
MEMORY_ONLY_FIELDS = ("batch_tokens", "activation_checkpointing", "data_parallel")
# Where a run trains, not what it computes: every torchrun rank (each on cuda:LOCAL_RANK) resumes the leader's
# checkpoint. Each is hashed as this value, the CPU's, which checkpoints written before placement was left out hold.
PLACEMENT_FIELDS = {"device": "cpu"}


@dataclass
class TrainConfig:
    """How to train one drafter; the defaults suit the built-in CPU targets."""

    method: str = DEFAULT_METHOD
    draft_vocab_size: int | None = None  # None: the target's whole vocabulary
    aux_layer_ids: tuple[int, ...] | None = None  # EAGLE-3 only; None: default_aux_layer_ids(target layers)
    medusa_heads: int = 4
    # DFlash: the positions of a drafted block (up to block_size - 1 draft tokens) and its masked rows' token; None:
    # the drafter's defaults (the mask: the target's pad token, else its last id)
    block_size: int | None = None
    mask_token_id: int | None = None
    max_draft_tokens: int | None = None  # P-EAGLE: the depths it learns each step; None: the drafter's default
    draft_model_parameters: int | None = None  # draft_model only: parameter budget (None: an eagle3 drafter's)
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1  # the cosine decay ends at lr * min_lr_ratio (0: at zero, as SpecForge's does)
    ttt_steps: int = 1
    position_decay: float = 1.0  # chained drafters: draft position k's loss weighs position_decay**k
    # What later training-time-test steps of an EAGLE-3 drafter are fed: its own predicted state ("drafter", as at
    # inference, speculators and SpecForge) or the target's ("target": only for the ablation that measures it).
    ttt_feed: str = "drafter"
    # The target's distribution is learnt at this temperature: below 1 it is sharpened towards the target's greedy
    # token, which is all a drafter served at T=0 needs to agree with (the agreement counts are unchanged).
    teacher_temperature: float = 1.0
    noise_std: float = 0.0  # Gaussian noise on the target states, for robustness to the target's drift
    holdout_fraction: float = 0.05
    seed: int = 0
    freeze_embeddings: bool = True
    checkpoint_every: int = 0  # steps between resumable checkpoints (0: none)
    eval_every: int = 0  # steps between held-out evaluations reported to on_progress (0: only at the end)
    # Memory bounds of a step: the step's windows are split into micro-batches of at most `batch_tokens` padded tokens
    # whose gradients accumulate; None: one micro-batch. Every micro-batch is padded to its own longest window.
    batch_tokens: int | None = None
    activation_checkpointing: bool = False  # recompute the drafter layer's activations in backward (EAGLE-3)
    data_parallel: str = DDP  # how torchrun ranks hold the drafter: data_parallel.REPLICAS (the steps are the same)
    device: str = "auto"  # "cpu", "cuda", "cuda:N" or "auto" (CUDA when available)
    precision: str = "auto"  # "bf16" (autocast), "fp32" or "auto" (machine.trains_in_bf16: bf16 where it is faster)

    @classmethod
    def from_profile(cls, profile: SyncProfile, warm_start: bool) -> TrainConfig:
        """The config a sync with `profile` trains with (`warm_start`: continuing the previous version's drafter)."""
        family = METHODS[profile.method].family
        return cls(
            method=profile.method,
            draft_vocab_size=None if METHODS[profile.method].full_vocabulary else profile.draft_vocab_size,
            aux_layer_ids=profile.aux_layer_ids,
            medusa_heads=profile.medusa_heads,
            # a method's own options only where it takes them, so another method's fingerprint stays as it was
            block_size=profile.block_size if family == DFLASH_FAMILY else None,
            mask_token_id=profile.mask_token_id if family in (DFLASH_FAMILY, PEAGLE_FAMILY) else None,
            max_draft_tokens=profile.max_draft_tokens if family == PEAGLE_FAMILY else None,
            steps=profile.warm_start_steps if warm_start else profile.train_steps,
            batch_size=profile.batch_size,
            seq_len=profile.seq_len,
            batch_tokens=profile.batch_tokens,
            activation_checkpointing=profile.activation_checkpointing,
            lr=profile.lr,
            warmup_steps=profile.warmup_steps,
            min_lr_ratio=profile.min_lr_ratio,
            ttt_steps=profile.ttt_steps,
            position_decay=profile.position_decay,
            teacher_temperature=profile.teacher_temperature,
            noise_std=profile.noise_std,
            seed=profile.seed,
            checkpoint_every=profile.checkpoint_every,
            device=profile.training_device,
            data_parallel=DDP if profile.data_parallel == "auto" else profile.data_parallel,
        )

    def check(self, world_size: int = 1) -> None:
        """Refuse settings no run can train with, each named with its fix (`world_size`: the training processes)."""
        if self.steps < 0:
            raise DraftsyncError(f"training steps {self.steps} is negative", "use steps >= 0")
        if self.ttt_steps < 1:
            raise DraftsyncError(f"ttt_steps={self.ttt_steps} is below 1", "use ttt_steps >= 1")
        if self.ttt_feed not in ("drafter", "target"):
            raise DraftsyncError(f"ttt_feed {self.ttt_feed!r} is not known", "use drafter or target")
        if self.ttt_feed == "target" and not is_eagle3_family(self.method):
            raise DraftsyncError(
                f"ttt_feed=target is measured for EAGLE-3 drafters only, not {self.method}", "use ttt_feed=drafter"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0 or not 0.0 < self.position_decay <= 1.0:
            raise DraftsyncError(
                f"min_lr_ratio {self.min_lr_ratio} or position_decay {self.position_decay} is out of range",
                "use 0 <= min_lr_ratio <= 1 and 0 < position_decay <= 1",
            )
        if self.teacher_temperature <= 0.0:
            raise DraftsyncError(
                f"teacher_temperature {self.teacher_temperature} is not positive", "use a teacher_temperature > 0"
            )
        if self.data_parallel not in REPLICAS:
            raise DraftsyncError(
                f"data_parallel {self.data_parallel!r} is not known", f"use one of {list(REPLICAS)} in the sync profile"
            )
        if self.batch_size < world_size:
            raise DraftsyncError(
                f"a batch of {self.batch_size} windows cannot be shared by {world_size} training processes",
                f"use batch_size >= {world_size} in the sync profile, or fewer processes",
            )

    def fingerprint(self, warm_start: bool = False) -> str:
        """What a checkpoint must agree with to be resumed: everything that shapes the run, `steps` included
        (the learning-rate schedule spans them) and whether it started from a previous drafter; not where it runs."""
        # Fields added after checkpoints were first written count only away from their defaults, so a run started
        # before they existed still resumes.
        later = {f.name: f.default for f in fields(self) if f.name in FIELDS_ADDED_LATER}
        data = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("checkpoint_every", "eval_every", *MEMORY_ONLY_FIELDS) and not (k in later and v == later[k])
        }
        data.update(PLACEMENT_FIELDS)
        data["warm_start"] = warm_start
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()[:16]
