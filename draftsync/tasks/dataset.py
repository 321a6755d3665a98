"""The training set of a sync: the target's states on its declared task mix, written as shards and checked."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.profiles import SyncProfile
from draftsync.registry.tags import TASK_MIX_TAG, TargetVersion
from draftsync.speculative.methods import METHODS
from draftsync.tasks import context


def target_task_mix(target_dir: Path, tags: dict[str, str] | None = None) -> dict[str, float]:
    """The task mix declared on the registry version, else in the checkpoint's draftsync_target.json."""
    declared = TargetVersion.from_tags(str(target_dir), None, tags).task_mix()
    if declared:
        return declared
    info = Path(target_dir) / "draftsync_target.json"
    if info.exists():
        return json.loads(info.read_text())["task_mix"]
    raise DraftsyncError(
        f"target {target_dir} declares no task mix",
        f"register it with the {TASK_MIX_TAG} tag (JSON shares per task)",
    )


def _checks_markdown(report: dict) -> str:
    rows = "\n".join(
        f"| {o['name']} | {o['check']} | {o['observed']} | {o['expected']} | {'pass' if o['passed'] else 'FAIL'} |"
        for o in report["outcomes"]
    )
    return (
        f"# Data checks ({report['sequences']} sequences)\n\n| expectation | checks | observed | expected | verdict |\n"
        f"|---|---|---|---|---|\n{rows}\n"
    )


@task(name="build-dataset", cache_policy=NONE)
def build_dataset(target_dir: str, task_mix: dict[str, float], profile: SyncProfile, out_dir: str) -> dict:
    """Shards of the target's states on texts of the task mix (teacher-forced) and on its own responses
    (written by vLLM or by transformers, as the profile's `response_writer` says; the manifest records which).

    Resumable: a rerun after a crash continues from the last complete shard. The Great Expectations
    data checks run on the result; a failure stops the sync with the table of what was observed.
    """
    from prefect.artifacts import create_markdown_artifact

    from draftsync.serving.vllm_responses import VllmResponseWriter, response_writer
    from draftsync.speculative.corpora import mixed_texts, task_prompts_for_mix
    from draftsync.speculative.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.samples import concat_samples, regenerated_samples, teacher_forced_samples
    from draftsync.speculative.shard_reader import ShardDataset
    from draftsync.speculative.shard_writer import build_shards
    from draftsync.speculative.targets import load_target
    from draftsync.validation.data_checks import run_data_checks

    logger = context.logger()
    model, tokenizer = load_target(Path(target_dir))
    pairs = mixed_texts(task_mix, profile.training_texts, seed=profile.seed)
    prompts = task_prompts_for_mix(task_mix, profile.generated_samples, seed=profile.seed + 100, split="train")
    sources = [teacher_forced_samples(tokenizer, pairs)]
    if profile.generated_samples:
        writer = response_writer(profile.response_writer)
        logger.info("dataset: %d responses written by %s", len(prompts), writer)
        sources.append(
            regenerated_samples(
                model,
                tokenizer,
                prompts,
                profile.generated_max_tokens,
                seed=profile.seed,
                writer=writer,
                open_writer=lambda: VllmResponseWriter(target_dir, context.settings().root / "serving"),
            )
        )
    layer_ids = tuple(profile.aux_layer_ids or default_aux_layer_ids(num_decoder_layers(model)))

    def progress(consumed: int, manifest: dict) -> None:
        logger.info(
            "dataset: %d samples, %d tokens in %d shards", consumed, manifest["total_tokens"], len(manifest["shards"])
        )

    manifest = build_shards(
        model,
        concat_samples(*sources),
        out_dir,
        layer_ids,
        store_aux=METHODS[profile.method].reads_aux_states,
        max_seq_len=profile.dataset_max_seq_len,
        target_name=target_dir,
        on_progress=progress,
    )
    try:
        checks = run_data_checks(ShardDataset(out_dir), model.config, task_mix).to_dict()
    except DraftsyncError as error:
        report = getattr(error, "report", None)
        if report is not None:
            create_markdown_artifact(markdown=_checks_markdown(report.to_dict()), description="failed data checks")
        raise
    create_markdown_artifact(markdown=_checks_markdown(checks), description="data checks")
    logger.info(
        "dataset %s: %d sequences, %d tokens, data checks passed",
        out_dir,
        manifest["num_sequences"],
        manifest["total_tokens"],
    )
    return {
        "path": str(out_dir),
        "sequences": manifest["num_sequences"],
        "tokens": manifest["total_tokens"],
        "loss_tokens": manifest["loss_tokens"],
        "texts": len(pairs),
        "generated": len(prompts) if profile.generated_samples else 0,
        "response_writer": manifest.get("response_writer"),  # absent from a build that predates it
        "tasks": manifest["tasks"],
        "checks": checks,
    }
