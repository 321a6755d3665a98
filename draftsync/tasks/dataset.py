"""The training set of a sync: the target's states on its declared task mix, written as shards and checked."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.profiles import SyncProfile
from draftsync.records import record_dict
from draftsync.registry.tags import TASK_MIX_TAG, TargetVersion
from draftsync.serving.traffic_capture import CAPTURED_TASK
from draftsync.speculative.methods import METHODS
from draftsync.speculative.placement import TargetPlacement
from draftsync.tasks import context
from draftsync.validation.data_checks import DataCheckReport, run_data_checks


@dataclass(frozen=True)
class DatasetBuild:
    """A sync's training set: where its shards are, what they hold, and its data checks. `as_dict()` is a sync's
    `dataset` (the checks are its `data_checks`, `checks.to_dict()`): keys users read, in this order."""

    path: str
    sequences: int
    tokens: int
    loss_tokens: int
    texts: int
    generated: int
    captured: int  # sequences answering captured traffic
    response_writer: str | None  # None for a build that predates its record in the manifest
    states_engine: str | None  # what took the stored states ("transformers", "vllm"); None: none stored (online)
    tasks: dict[str, dict[str, int]]  # per task: its sequences, tokens and loss tokens
    checks: DataCheckReport

    def as_dict(self) -> dict[str, Any]:
        return record_dict(self, omit={"checks"})


@dataclass(frozen=True)
class TaskMix:
    """The task shares a sync builds its data and its validation for, and where they came from (said in the plan,
    the drafter's tags and its description)."""

    shares: dict[str, float]
    source: str

    def text(self) -> str:
        shares = ", ".join(f"{task} {share:.2f}" for task, share in sorted(self.shares.items()))
        return f"{shares} ({self.source})"


def target_task_mix(
    target_dir: Path, tags: dict[str, str] | None = None, default: Mapping[str, float] | None = None
) -> TaskMix:
    """The task mix declared on the registry version, else in the checkpoint's draftsync_target.json, else
    `default` (a sync profile's), refused only when there is none."""
    declared = TargetVersion.from_tags(str(target_dir), None, tags).task_mix()
    if declared:
        return TaskMix(declared, f"declared by the target version's {TASK_MIX_TAG} tag")
    info = Path(target_dir) / "draftsync_target.json"
    if info.exists():
        return TaskMix(json.loads(info.read_text())["task_mix"], "declared by the checkpoint's draftsync_target.json")
    if default:
        return TaskMix(dict(default), f"the sync profile's default: the target declares no {TASK_MIX_TAG} tag")
    raise DraftsyncError(
        f"target {target_dir} declares no task mix",
        f"register it with the {TASK_MIX_TAG} tag (JSON shares per task)",
    )


def planned_dataset_tokens(model, tokenizer, texts, prompts, profile: SyncProfile) -> int:
    """Tokens the dataset will hold at most: the texts' own (cut at the longest sequence kept), and for each prompt
    its tokens and the longest response the profile lets the target write."""
    longest = profile.dataset_max_seq_len or getattr(model.config, "max_position_embeddings", None) or 1 << 30
    tokens = sum(min(len(sample.input_ids), longest) for sample in texts.iter_from(0))
    if profile.generated_samples:
        tokens += sum(
            min(len(tokenizer(prompt)["input_ids"]) + profile.generated_max_tokens, longest) for _, prompt in prompts
        )
    return tokens


def check_dataset_disk(out_dir: Path, tokens: int, bytes_per_token: int) -> None:
    """Refuse, before a byte is written, a dataset the disk (or DRAFTSYNC_DISK_BUDGET_GB) cannot hold; shards a
    resumed build already wrote count as written."""
    import shutil

    from draftsync.speculative.data.samples import RESPONSES_FILE

    needed = tokens * bytes_per_token
    # the responses a server wrote first are the build's input, not its states
    stored = [f for f in out_dir.rglob("*") if f.is_file() and f.name != RESPONSES_FILE] if out_dir.exists() else []
    written = sum(f.stat().st_size for f in stored)
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    budget = context.settings().disk_budget_gb
    room = min(free, int(budget * 1e9)) if budget is not None else free
    what = "DRAFTSYNC_DISK_BUDGET_GB" if budget is not None and room < free else f"free space on {existing}"
    if needed - written > room:
        raise DraftsyncError(
            f"the dataset for this sync needs up to {needed / 1e9:.3g} GB ({tokens:,} tokens at {bytes_per_token:,} "
            f"bytes each) and {what} allows {room / 1e9:.3g} GB; nothing was written",
            "free disk space or raise DRAFTSYNC_DISK_BUDGET_GB, or sync with a profile of fewer training_texts, "
            "generated_samples or a shorter dataset_max_seq_len",
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


def with_captured_traffic(
    texts: list[tuple[str, str]], prompts: list[tuple[str, str]], captured: list[str], profile: SyncProfile
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], int]:
    """(texts, response prompts, how many prompts are captured ones): `captured_share` of the dataset's sequences
    answer captured prompts (a seeded draw, each once), as far as there are captured prompts; the declared texts and
    prompts make up the rest, each task of the declared mix giving up the same share."""
    import random

    distinct = list(dict.fromkeys(p for p in captured if p.strip()))
    declared_total = len(texts) + len(prompts)
    count = min(len(distinct), round(profile.captured_share * declared_total))
    if count == 0:
        return texts, prompts, 0
    chosen = random.Random(profile.seed + 200).sample(distinct, count)
    room = count * (1.0 - profile.captured_share) / profile.captured_share
    keep = min(1.0, room / declared_total)

    def kept(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        by_task: dict[str, list[tuple[str, str]]] = {}
        for pair in pairs:
            by_task.setdefault(pair[0], []).append(pair)
        return [pair for group in by_task.values() for pair in group[: round(len(group) * keep)]]

    answered = chosen + captured_openings(chosen, profile.captured_openings)
    return kept(texts), [(CAPTURED_TASK, prompt) for prompt in answered] + kept(prompts), len(answered)


def captured_openings(prompts: list[str], per_prompt: int) -> list[str]:
    """Each prompt's openings, cut at k / (per_prompt + 1) of its words (k = 1..per_prompt; at least four words,
    each opening once): the target answers them too, more on-policy responses of the traffic that went stale than
    its distinct prompts alone give."""
    seen = set(prompts)
    out = []
    for prompt in prompts:
        words = prompt.split(" ")
        for k in range(1, per_prompt + 1):
            opening = " ".join(words[: len(words) * k // (per_prompt + 1)])
            if len(opening.split()) >= 4 and opening not in seen:
                seen.add(opening)
                out.append(opening)
    return out


def drawn_mix(task_mix: dict[str, float], sequences: int, from_traffic: int) -> dict[str, float]:
    """The task shares a dataset was drawn in, for its checks: the declared mix for what is not captured traffic."""
    if not from_traffic:
        return task_mix
    total = sum(task_mix.values())
    drawn = {task: share / total * (sequences - from_traffic) for task, share in task_mix.items()}
    return {**drawn, CAPTURED_TASK: float(from_traffic)}


def _inputs(
    task_mix: dict[str, float], profile: SyncProfile, captured: list[str] | None
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], int]:
    """(texts, prompts to answer, how many of them are captured traffic), drawn for the profile."""
    from draftsync.speculative.data.corpora import mixed_texts, response_prompts

    pairs = mixed_texts(task_mix, profile.training_texts, seed=profile.seed)
    prompts = response_prompts(task_mix, profile)
    pairs, prompts, from_traffic = with_captured_traffic(pairs, prompts, captured or [], profile)
    if profile.generated_samples and len(prompts) < profile.generated_samples:
        context.logger().info(
            "dataset: %d responses asked for, %d distinct prompts drawn: each is answered once",
            profile.generated_samples,
            len(prompts),
        )
    return pairs, prompts, from_traffic


def _vllm_responses_first(
    target_dir: str,
    tokenizer: Any,
    prompts: list[tuple[str, str]],
    profile: SyncProfile,
    servers: dict | None,
    out_dir: str,
) -> Any:
    """Every response written by a vLLM server on the plan's GPUs, and the server stopped, before the transformers
    target is loaded there (`samples.responses_written_first`)."""
    from draftsync.serving.vllm_args import ServerResources
    from draftsync.serving.vllm_responses import VllmResponseWriter
    from draftsync.speculative.data.samples import regenerated_samples, responses_written_first

    context.logger().info("dataset: %d responses written by vllm before the target is loaded", len(prompts))
    resources = ServerResources.from_plan(servers)
    source = regenerated_samples(
        None,
        tokenizer,
        prompts,
        profile.generated_max_tokens,
        seed=profile.seed,
        writer="vllm",
        open_writer=lambda: VllmResponseWriter(target_dir, context.settings().root / "serving", resources=resources),
    )
    return responses_written_first(source, out_dir)


@contextmanager
def _vllm_states(
    target_dir: str, model: Any, layer_ids: tuple[int, ...], servers: dict | None, out_dir: str, engine: str
) -> Iterator[Any]:
    """The shard writer's state source when vLLM takes the states (a server on the plan's GPUs, stopped after the
    build), else None: the target's own forward passes. A complete build starts no server."""
    from draftsync.speculative.data.shard_manifest import MANIFEST_FILE

    manifest = Path(out_dir) / MANIFEST_FILE
    if engine != "vllm" or (manifest.exists() and json.loads(manifest.read_text()).get("complete")):
        yield None
        return
    from draftsync.serving.vllm_args import ServerResources
    from draftsync.serving.vllm_states import VllmStateReader, aux_and_final
    from draftsync.speculative.data.hidden_states import final_norm_of, num_decoder_layers
    from draftsync.speculative.data.vllm_connector import captured_layer_ids

    layers = num_decoder_layers(model)
    captured = captured_layer_ids(layer_ids, layers)
    context.logger().info("dataset: hidden states of layers %s taken by vLLM", list(captured))
    work = Path(out_dir).parent / f"{Path(out_dir).name}.vllm-states"
    with VllmStateReader(target_dir, captured, work, resources=ServerResources.from_plan(servers)) as reader:
        yield aux_and_final(reader, layer_ids, layers, final_norm_of(model))


def _checked(out_dir: str, model_config: Any, drawn_from: dict[str, float]) -> DataCheckReport:
    """The data checks on the written shards, their table an artifact whether they pass or not."""
    from prefect.artifacts import create_markdown_artifact

    from draftsync.speculative.data.shard_reader import ShardDataset

    try:
        checks = run_data_checks(ShardDataset(out_dir), model_config, drawn_from)
    except DraftsyncError as error:
        report = getattr(error, "report", None)
        if report is not None:
            create_markdown_artifact(markdown=_checks_markdown(report.to_dict()), description="failed data checks")
        raise
    create_markdown_artifact(markdown=_checks_markdown(checks.to_dict()), description="data checks")
    return checks


@task(name="build-dataset", cache_policy=NONE)
def build_dataset(
    target_dir: str,
    task_mix: dict[str, float],
    profile: SyncProfile,
    out_dir: str,
    placement: TargetPlacement | None = None,
    servers: dict | None = None,
    captured: list[str] | None = None,
    states_server: dict | None = None,
) -> DatasetBuild:
    """Shards of the target's states on texts of the task mix (teacher-forced) and on its own responses
    (written by vLLM or by transformers, as the profile's `response_writer` says; the manifest records which). vLLM
    writes them all first, on the GPUs the plan gives its server alone, and the transformers target is loaded on the
    plan's devices only after the server has stopped.
    `captured`: prompts of the traffic a deployment served, answered (on-policy) for `captured_share` of the dataset's
    sequences, under the task name "captured" (`with_captured_traffic`).

    Resumable: a rerun after a crash continues from the last complete shard. The Great Expectations
    data checks run on the result; a failure stops the sync with the table of what was observed. `placement`: where
    the target runs (the plan's; None: the CPU); `servers`: the GPUs the plan gives a vLLM response writer."""
    from draftsync.serving.vllm_responses import response_writer
    from draftsync.speculative.data import shard_bytes_per_token
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.data.samples import concat_samples, regenerated_samples, teacher_forced_samples
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.speculative.placement import shared_target
    from draftsync.speculative.targets import load_target_head, load_tokenizer

    logger = context.logger()
    pairs, prompts, from_traffic = _inputs(task_mix, profile, captured)
    writer = response_writer(profile.response_writer) if profile.generated_samples else None
    written = None
    if writer == "vllm":
        written = _vllm_responses_first(
            target_dir, load_tokenizer(Path(target_dir)), prompts, profile, servers, out_dir
        )
    # tokens only on disk: the plan chose online (or the profile asked), or speculators' vLLM writes the states
    online = profile.hidden_states == "online" or profile.trainer == "speculators"
    # the plan resolved the engine (profile_updates); "auto" outside a sync keeps the target's own pass
    from_vllm = profile.hidden_states_engine == "vllm"  # now, or online as training reads each batch
    engine = "vllm" if from_vllm and not online else "transformers"
    if engine == "vllm" and writer != "hf":  # nothing here runs the target's layers: its head will do
        model, tokenizer = load_target_head(Path(target_dir)), load_tokenizer(Path(target_dir))
    else:
        model, tokenizer = shared_target(Path(target_dir), placement)
    sources = [teacher_forced_samples(tokenizer, pairs)]
    if writer is not None:
        logger.info("dataset: %d responses written by %s", len(prompts), writer)
        sources.append(
            regenerated_samples(
                model,
                tokenizer,
                prompts,
                profile.generated_max_tokens,
                seed=profile.seed,
                writer=writer,
                open_writer=None if written is None else lambda: written,
            )
        )
    layer_ids = tuple(profile.aux_layer_ids or default_aux_layer_ids(num_decoder_layers(model)))
    store_aux = METHODS[profile.method].reads_aux_states
    check_dataset_disk(
        Path(out_dir),
        planned_dataset_tokens(model, tokenizer, sources[0], prompts, profile),
        shard_bytes_per_token(model.config.hidden_size, store_aux, online=online),
    )

    def progress(consumed: int, manifest: dict) -> None:
        logger.info(
            "dataset: %d samples, %d tokens in %d shards", consumed, manifest["total_tokens"], len(manifest["shards"])
        )

    max_seq_len = profile.dataset_max_seq_len
    if from_vllm:  # a request to vLLM generates one token, so a row leaves it one position of the context
        context_length = int(model.config.max_position_embeddings) - 1
        max_seq_len = min(max_seq_len or context_length, context_length)
    with _vllm_states(target_dir, model, layer_ids, states_server, out_dir, engine) as states:
        manifest = build_shards(
            model,
            concat_samples(*sources),
            out_dir,
            layer_ids,
            store_aux=store_aux,
            max_seq_len=max_seq_len,
            target_name=target_dir,
            on_progress=progress,
            online=online,
            states=states,
            states_engine=engine,
        )
    checks = _checked(out_dir, model.config, drawn_mix(task_mix, len(pairs) + len(prompts), from_traffic))
    logger.info(
        "dataset %s: %d sequences, %d tokens, data checks passed",
        out_dir,
        manifest["num_sequences"],
        manifest["total_tokens"],
    )
    return DatasetBuild(
        path=str(out_dir),
        sequences=manifest["num_sequences"],
        tokens=manifest["total_tokens"],
        loss_tokens=manifest["loss_tokens"],
        texts=len(pairs),
        generated=len(prompts) if profile.generated_samples else 0,
        captured=from_traffic,
        response_writer=manifest.get("response_writer"),  # absent from a build that predates it
        states_engine=None
        if online
        else ", ".join(sorted({s.get("states_engine") or "transformers" for s in manifest["shards"]})),
        tasks=manifest["tasks"],
        checks=checks,
    )
