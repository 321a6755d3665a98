"""A target's own MTP head in a sync: saved as the drafter directory vLLM serves with method mtp, as the target
version shipped it or refreshed on that version's own answers (the trunk frozen, speculative/train/mtp_refresh.py).

A saved head is a separate MTP checkpoint (mtp/checkpoint.py), not a link into the target: what validation measured
is then byte for byte what a rollout serves, whichever head the sync promotes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from draftsync.profiles import SyncProfile
from draftsync.tasks import context

# Steps averaged for a refresh's first and final loss: a batch's loss swings with its tasks' entropy.
LOSS_WINDOW = 20


@dataclass(frozen=True)
class HeadRefresh:
    """How a sync refreshed a head: the target's answers it learnt from, its steps and losses, and its seconds."""

    samples: int
    captured: int  # of those, answers to prompts of the deployments' captured traffic (a retrain's)
    steps: int
    lr: float
    first_loss: float  # the mean of the first LOSS_WINDOW steps
    final_loss: float  # ... of the last
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _save(head: Any, target_dir: str, out_dir: str, gamma: int) -> str:
    from draftsync.speculative.methods.checkpoint_files import read_json
    from draftsync.speculative.methods.registry import save_drafter

    _, config = read_json(target_dir)
    return str(save_drafter(head, out_dir, target_dir, list(config.get("architectures") or ()), gamma))


@task(name="save-shipped-head", cache_policy=NONE)
def save_shipped_head(target_dir: str, out_dir: str, gamma: int) -> str:
    """The head the target version ships, written as its own MTP checkpoint in `out_dir`."""
    from draftsync.speculative.methods.mtp.checkpoint import read_shipped_mtp

    return _save(read_shipped_mtp(target_dir), target_dir, out_dir, gamma)


@task(name="refresh-head", cache_policy=NONE)
def refresh_shipped_head(
    target_dir: str,
    task_mix: dict[str, float],
    profile: SyncProfile,
    out_dir: str,
    gamma: int,
    captured: list[str] | None = None,
) -> HeadRefresh:
    """Fine-tune the shipped head on the target's greedy answers to the task mix's prompts (the dataset's response
    prompts; a retrain's `captured` traffic takes the profile's captured share of them, as in a dataset), for the
    profile's warm-start steps (a refresh starts from a trained head), and save it in `out_dir`."""
    import torch

    from draftsync.speculative.data.corpora import response_prompts
    from draftsync.speculative.data.responses import generate_responses
    from draftsync.speculative.methods.mtp.checkpoint import read_shipped_mtp
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.mtp_refresh import refresh_head
    from draftsync.tasks.dataset import with_captured_traffic

    started = time.perf_counter()
    torch.manual_seed(profile.seed)
    model, tokenizer = load_target(Path(target_dir))
    _, prompts, from_traffic = with_captured_traffic([], response_prompts(task_mix, profile), captured or [], profile)
    texts = [text for _, text in prompts]
    sequences, masks = generate_responses(model, tokenizer, texts, profile.generated_max_tokens)
    samples = list(zip(sequences, masks, strict=True))
    head = read_shipped_mtp(target_dir)
    context.logger().info(
        "refreshing the MTP head of %s: %d answers, %d steps", target_dir, len(samples), profile.warm_start_steps
    )
    losses = refresh_head(
        model,
        head,
        samples,
        steps=profile.warm_start_steps,
        lr=profile.lr,
        batch_size=profile.batch_size,
        window=profile.seq_len,
        ttt_steps=profile.ttt_steps,
        seed=profile.seed,
    )
    _save(head, target_dir, out_dir, gamma)
    first, last = losses[:LOSS_WINDOW], losses[-LOSS_WINDOW:]
    return HeadRefresh(
        samples=len(samples),
        captured=from_traffic,
        steps=len(losses),
        lr=profile.lr,
        first_loss=round(sum(first) / len(first), 4),
        final_loss=round(sum(last) / len(last), 4),
        seconds=round(time.perf_counter() - started, 1),
    )
