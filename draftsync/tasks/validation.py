"""The validation gates a drafter must pass before it may serve (deepened by the checklist issue)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from draftsync.tasks import context
from draftsync.tasks.profile import SyncProfile


@task(name="validate-drafter", cache_policy=NONE)
def validate_drafter(target_dir: str, drafter_dir: str, task_mix: dict[str, float], profile: SyncProfile) -> dict:
    """Run held-out prompts of the task mix through the reference engine; return metrics and gate verdicts."""
    import torch

    from draftsync.monitors.trends import percentile
    from draftsync.speculative.corpora import prompts_for_mix
    from draftsync.speculative.engine import SpeculativeEngine
    from draftsync.speculative.drafters import load_drafter
    from draftsync.speculative.targets import load_target

    logger = context.logger()
    target, tokenizer = load_target(Path(target_dir))
    drafter = load_drafter(Path(drafter_dir))
    if drafter.config.vocab_size != target.config.vocab_size:
        from draftsync.errors import DraftsyncError

        raise DraftsyncError(
            f"drafter {drafter_dir} was built for a vocabulary of {drafter.config.vocab_size} tokens, "
            f"target {target_dir} has {target.config.vocab_size}",
            "train the drafter against this target (draftsync sync)",
        )
    spec = SpeculativeEngine(target, drafter, profile.gamma)
    plain = SpeculativeEngine(target, None, 0)
    prompt_texts = prompts_for_mix(task_mix, profile.validation_requests, seed=profile.seed + 11)
    rates = []
    totals = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
    per_position = [0] * profile.gamma
    lossless_ok = True
    with torch.no_grad():
        for i, text in enumerate(prompt_texts):
            ids = tokenizer(text)["input_ids"]
            result = spec.generate(ids, profile.validation_max_tokens, temperature=profile.temperature, seed=profile.seed + i)
            stats = result.stats
            rates.append(stats.acceptance_rate)
            totals["drafts"] += stats.drafts
            totals["draft_tokens"] += stats.draft_tokens
            totals["accepted"] += stats.accepted
            per_position = [a + b for a, b in zip(per_position, stats.accepted_per_position)]
            if i < 2:  # speculation must not change the output: greedy with and without it agree
                greedy_spec = spec.generate(ids, profile.validation_max_tokens, temperature=0.0).token_ids
                greedy_plain = plain.generate(ids, profile.validation_max_tokens, temperature=0.0).token_ids
                lossless_ok = lossless_ok and greedy_spec == greedy_plain
    acceptance = totals["accepted"] / max(1, totals["draft_tokens"])
    metrics = {
        "acceptance_rate": acceptance,
        "mean_acceptance_length": 1 + totals["accepted"] / max(1, totals["drafts"]),
        "acceptance_p5": percentile(rates, 5),
        "acceptance_p50": percentile(rates, 50),
        "acceptance_p90": percentile(rates, 90),
        "requests": len(prompt_texts),
        "temperature": profile.temperature,
        **{f"acceptance_pos{i}": n / max(1, totals["drafts"]) for i, n in enumerate(per_position)},
    }
    gates = [
        {"name": "lossless_greedy", "value": float(lossless_ok), "threshold": 1.0, "passed": lossless_ok},
        {
            "name": "validation_acceptance_mean",
            "value": round(acceptance, 4),
            "threshold": profile.min_acceptance,
            "passed": acceptance > profile.min_acceptance,
        },
    ]
    passed = all(g["passed"] for g in gates)
    logger.info("validation: acceptance %.3f over %d requests; passed=%s", acceptance, len(prompt_texts), passed)
    return {"metrics": metrics, "gates": gates, "passed": passed}
