"""The training set of a sync: the target's declared task mix, tokenized, with a coverage check."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.tasks.profile import SyncProfile

COVERAGE_TOLERANCE = 0.05  # each task's share within 5 points of the declared mix (the seed's checklist)


def target_task_mix(target_dir: Path, tags: dict[str, str] | None = None) -> dict[str, float]:
    """The task mix declared on the registry version, else in the checkpoint's draftsync_target.json."""
    if tags and tags.get("draftsync.task_mix"):
        try:
            return {k: float(v) for k, v in json.loads(tags["draftsync.task_mix"]).items()}
        except (ValueError, AttributeError) as exc:
            raise DraftsyncError(
                f"registry tag draftsync.task_mix={tags['draftsync.task_mix']!r} is not a JSON object of shares",
                'set it to e.g. {"code": 0.5, "math": 0.5}',
            ) from exc
    info = Path(target_dir) / "draftsync_target.json"
    if info.exists():
        return json.loads(info.read_text())["task_mix"]
    raise DraftsyncError(
        f"target {target_dir} declares no task mix",
        "register it with the draftsync.task_mix tag (JSON shares per task)",
    )


def check_coverage(tasks: list[str], task_mix: dict[str, float]) -> dict[str, dict[str, float]]:
    """Observed vs declared share per task; raises when any task is off by more than the tolerance."""
    total = sum(task_mix.values())
    counts = Counter(tasks)
    report = {}
    for task_name, share in task_mix.items():
        observed = counts.get(task_name, 0) / max(1, len(tasks))
        report[task_name] = {"declared": share / total, "observed": observed}
    off = {t: r for t, r in report.items() if abs(r["observed"] - r["declared"]) > COVERAGE_TOLERANCE}
    if off:
        raise DraftsyncError(
            f"training data does not cover the declared task mix: {off}",
            "add texts for the missing tasks or correct the target's draftsync.task_mix tag",
        )
    return report


@task(name="build-training-set", cache_policy=NONE)
def build_training_set(target_dir: str, task_mix: dict[str, float], profile: SyncProfile) -> dict:
    """Texts of the task mix (teacher-forced) plus responses the target writes to prompts of that mix.

    Loss masks cover whole texts and only the response part of generated samples.
    """
    from draftsync.speculative.corpora import mixed_texts, prompts_for_mix
    from draftsync.speculative.responses import generate_responses
    from draftsync.speculative.targets import load_target

    model, tokenizer = load_target(Path(target_dir))
    pairs = mixed_texts(task_mix, profile.training_texts, seed=profile.seed)
    coverage = check_coverage([t for t, _ in pairs], task_mix)
    eos = tokenizer.eos_token_id
    sequences = [ids + [eos] for ids in tokenizer([text for _, text in pairs])["input_ids"]]
    masks = [[1] * len(s) for s in sequences]
    prompt_texts = prompts_for_mix(task_mix, profile.generated_samples, seed=profile.seed + 100, split="train")
    generated, generated_masks = generate_responses(
        model, tokenizer, prompt_texts, profile.generated_max_tokens, seed=profile.seed
    )
    samples = [(s, m) for s, m in zip(sequences + generated, masks + generated_masks) if len(s) > 1]
    sequences, masks = [s for s, _ in samples], [m for _, m in samples]
    if not sequences:
        raise DraftsyncError(f"the training set for {target_dir} is empty", "declare a task mix with texts")
    return {
        "sequences": sequences,
        "loss_masks": masks,
        "coverage": coverage,
        "texts": len(pairs),
        "generated": len(generated),
        "tokens": sum(len(s) for s in sequences),
    }
