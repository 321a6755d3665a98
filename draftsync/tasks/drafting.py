"""Train a drafter for a target version and save it in the format vLLM loads (speculators eagle3)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from draftsync.tasks import context
from draftsync.tasks.profile import SyncProfile


@task(name="train-drafter", cache_policy=NONE)
def train_drafter(
    target_dir: str,
    sequences: list[list[int]],
    loss_masks: list[list[int]],
    profile: SyncProfile,
    out_dir: str,
    warm_start_dir: str | None = None,
    verifier_name: str | None = None,
) -> dict:
    """Train (warm-starting from `warm_start_dir` when its shapes match) and save to `out_dir`."""
    import torch

    from draftsync.speculative.speculators_format import load_eagle3, save_eagle3
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.training import TrainConfig, train_eagle3

    logger = context.logger()
    target, _ = load_target(Path(target_dir))
    init_from = None
    if warm_start_dir is not None:
        candidate = load_eagle3(Path(warm_start_dir))
        if candidate.config.target_hidden_size == target.config.hidden_size and candidate.config.vocab_size == target.config.vocab_size:
            init_from = candidate
            logger.info("warm start from %s", warm_start_dir)
        else:
            logger.info("previous drafter %s does not fit this target's shapes; training from scratch", warm_start_dir)
    config = TrainConfig(
        draft_vocab_size=profile.draft_vocab_size,
        steps=profile.warm_start_steps if init_from is not None else profile.train_steps,
        batch_size=profile.batch_size,
        seq_len=profile.seq_len,
        lr=profile.lr,
        ttt_steps=profile.ttt_steps,
        seed=profile.seed,
        fc_norm=profile.method == "eagle3.1",
        norm_output=profile.method == "eagle3.1",
    )
    every = max(1, (config.steps or 1) // 5)

    def progress(step: int, total: int | None, metrics: dict[str, float]) -> None:
        if step % every == 0 or step == total:
            logger.info("drafter training step %d/%s loss %.3f", step, total, metrics.get("loss", float("nan")))

    torch.manual_seed(profile.seed)
    drafter, report = train_eagle3(target, sequences, loss_masks, config, init_from=init_from, on_progress=progress)
    out = Path(out_dir)
    save_eagle3(
        drafter,
        out,
        verifier_name_or_path=verifier_name or str(target_dir),
        verifier_architectures=list(target.config.architectures or ["LlamaForCausalLM"]),
        speculative_tokens=profile.gamma,
    )
    summary = {
        "steps": report.steps,
        "seconds": round(report.seconds, 1),
        "tokens_per_s": round(report.tokens_per_s),
        "final_loss": round(report.final_loss, 4),
        "top1_agreement": round(report.top1_agreement, 4),
        "warm_start": init_from is not None,
        "draft_vocab_size": report.draft_vocab_size,
        "aux_layer_ids": report.aux_layer_ids,
    }
    (out / "draftsync_training.json").write_text(json.dumps(summary, indent=2))
    logger.info("drafter trained: %s", summary)
    return summary
