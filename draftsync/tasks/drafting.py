"""Train a drafter for a target version from its dataset and save it in the format its server loads."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NONE

from draftsync.profiles import SyncProfile
from draftsync.speculative.placement import TargetPlacement
from draftsync.speculative.train.ranks import RankSpec
from draftsync.tasks import context

ONLINE_RESTARTS = 2  # starts of the online states' server after it dies, before the training stops with its error

if TYPE_CHECKING:
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import TrainReport

HISTORY_FILE = "history.json"  # in the checkpoint directory: name -> [(step, value)]
RANKS_LOG = "ranks.log"  # in the checkpoint directory: what torchrun and its ranks printed
SUMMARY_FILE = "draftsync_training.json"  # in the drafter directory: the training summary's as_dict()


@dataclass(frozen=True)
class TrainingSummary:
    """What draftsync's own trainer did for a drafter. `as_dict()` is draftsync_training.json, the drafter version's
    `draftsync.training.*` tags and a sync's `training`: its keys, their order and types are what users read."""

    method: str
    steps: int
    resumed_from_step: int
    seconds: float
    tokens_per_s: int
    final_loss: float
    top1_agreement: float
    position_accuracy: tuple[float, ...]
    warm_start: bool
    train_processes: int
    draft_vocab_size: int
    parameters: int
    parameters_pct_of_target: float
    aux_layer_ids: tuple[int, ...] | None = None  # the target depths an EAGLE-3 drafter reads; None: not one

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "steps": self.steps,
            "resumed_from_step": self.resumed_from_step,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "final_loss": self.final_loss,
            "top1_agreement": self.top1_agreement,
            "position_accuracy": list(self.position_accuracy),
            "warm_start": self.warm_start,
            "train_processes": self.train_processes,
            "draft_vocab_size": self.draft_vocab_size,
            "parameters": self.parameters,
            "parameters_pct_of_target": self.parameters_pct_of_target,
        }
        if self.aux_layer_ids is not None:
            out["aux_layer_ids"] = list(self.aux_layer_ids)
        return out


@dataclass(frozen=True)
class SpeculatorsTrainingSummary:
    """What `speculators train` did for a drafter; `as_dict()` as TrainingSummary's, with speculators' own keys."""

    method: str
    epochs: int
    checkpoint: str
    seconds: float
    warm_start: bool
    train_processes: int
    draft_vocab_size: int
    parameters: int
    aux_layer_ids: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "trainer": "speculators",
            "epochs": self.epochs,
            "checkpoint": self.checkpoint,
            "seconds": self.seconds,
            "warm_start": self.warm_start,
            "train_processes": self.train_processes,
            "draft_vocab_size": self.draft_vocab_size,
            "parameters": self.parameters,
            "aux_layer_ids": list(self.aux_layer_ids),
        }


Training = TrainingSummary | SpeculatorsTrainingSummary


def _warm_start_source(warm_start_dir: str | None, profile: SyncProfile, target):
    """The previous drafter, when it is of the same method and fits this target's shapes; else None."""
    from draftsync.speculative.methods.registry import drafter_method, load_drafter

    logger = context.logger()
    if warm_start_dir is None or not profile.warm_start:
        return None
    method = drafter_method(Path(warm_start_dir))
    if method != profile.method:
        logger.info("previous drafter is %s, this sync trains %s: training from scratch", method, profile.method)
        return None
    candidate = load_drafter(Path(warm_start_dir))
    if (
        candidate.config.target_hidden_size != target.config.hidden_size
        or candidate.config.vocab_size != target.config.vocab_size
    ):
        logger.info("previous drafter %s does not fit this target's shapes: training from scratch", warm_start_dir)
        return None
    return candidate


def _train_on_ranks(
    spec: RankSpec, profile: SyncProfile, log_dir: Path, devices: Sequence[int] = ()
) -> tuple[Any, TrainReport]:
    """Train under torchrun with the profile's ranks on this node (and as many on each of its other nodes, which run
    the logged command on the same spec); the leader saves the drafter to `spec.out_dir`.

    The sync's shared target is released first: each rank loads the head it trains against."""
    from draftsync.speculative.methods.registry import load_drafter
    from draftsync.speculative.placement import release_shared_targets
    from draftsync.speculative.train.ranks import REPORT_FILE, command, launch
    from draftsync.speculative.train.training import TrainReport

    release_shared_targets()
    log_dir.mkdir(parents=True, exist_ok=True)
    spec_file = spec.write(log_dir / "rank-spec.json")
    processes, nodes, rendezvous = profile.train_processes, profile.train_nodes, profile.train_rendezvous
    argv = command(spec_file, processes, nodes, rendezvous)
    context.logger().info("training on %d torchrun ranks: %s", processes * nodes, " ".join(argv))
    launch(spec_file, processes, log_dir / RANKS_LOG, nodes, rendezvous, devices=devices)
    out = Path(spec.out_dir)
    report = TrainReport(**json.loads((out / REPORT_FILE).read_text()))
    return load_drafter(out), report


def _train_with_speculators(
    target_dir: str,
    dataset_dir: str,
    profile: SyncProfile,
    out_dir: str,
    checkpoint_dir: str,
    warm_start_dir: str | None,
    verifier_name: str | None,
    servers: dict[str, Any] | None,
) -> SpeculatorsTrainingSummary:
    """`speculators train` on the dataset's tokens, its hidden states written by a vLLM server of the target with the
    plan's tensor parallelism; its last checkpoint is saved as the drafter, in the format the server loads.

    The profile's steps become epochs over the dataset's windows, its ranks and nodes speculators' torchrun."""
    import math
    import time

    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.methods.eagle3.checkpoint import load_eagle3
    from draftsync.speculative.methods.registry import drafter_method, parameter_count, save_drafter
    from draftsync.speculative.placement import release_shared_targets
    from draftsync.speculative.train.speculators import SpeculatorsTrainJob, run_job, write_token_rows

    release_shared_targets()  # the hidden-state server takes the GPUs the dataset's target held
    logger = context.logger()
    work = Path(checkpoint_dir) / "speculators"
    rows = list(ShardDataset(dataset_dir).token_rows())
    data = write_token_rows(work / "token-rows.jsonl", [ids for ids, _ in rows], [mask for _, mask in rows])
    windows = sum(math.ceil(len(ids) / profile.seq_len) for ids, _ in rows)
    warm = warm_start_dir if warm_start_dir and profile.warm_start else None
    job = SpeculatorsTrainJob(
        target=str(target_dir),
        data=(str(data),),
        work_dir=str(work),
        output_dir=str(work / "checkpoints"),
        method=profile.method,
        draft_vocab_size=profile.draft_vocab_size,
        aux_layer_ids=profile.aux_layer_ids,
        epochs=max(1, round(profile.train_steps * profile.batch_size / max(1, windows))),
        lr=profile.lr,
        ttt_steps=profile.ttt_steps,
        seq_length=profile.seq_len,
        total_seq_len=profile.batch_tokens or profile.batch_size * profile.seq_len,
        from_pretrained=warm if warm and drafter_method(Path(warm)) == profile.method else None,
        seed=profile.seed,
        gpus_per_node=profile.train_processes,
        nnodes=profile.train_nodes,
        rdzv_endpoint=profile.train_rendezvous,
        vllm_tensor_parallel_size=int((servers or {}).get("tensor_parallel_size", 1)),
    )
    started = time.perf_counter()
    checkpoint = run_job(job, on_line=logger.info)
    drafter = load_eagle3(checkpoint)
    config = json.loads((Path(target_dir) / "config.json").read_text())
    save_drafter(
        drafter,
        Path(out_dir),
        verifier_name_or_path=verifier_name or str(target_dir),
        verifier_architectures=list(config.get("architectures") or ["LlamaForCausalLM"]),
        speculative_tokens=profile.gamma,
    )
    counts = parameter_count(drafter)
    summary = SpeculatorsTrainingSummary(
        method=profile.method,
        epochs=job.epochs,
        checkpoint=str(checkpoint),
        seconds=round(time.perf_counter() - started, 1),
        warm_start=job.from_pretrained is not None,
        train_processes=profile.train_processes * profile.train_nodes,
        draft_vocab_size=drafter.config.draft_vocab_size,
        parameters=counts.own,
        aux_layer_ids=tuple(drafter.config.aux_layer_ids),
    )
    (Path(out_dir) / SUMMARY_FILE).write_text(json.dumps(summary.as_dict(), indent=2))
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    (Path(checkpoint_dir) / HISTORY_FILE).write_text(json.dumps({}))
    logger.info("drafter trained by speculators: %s", summary.as_dict())
    return summary


@task(name="train-drafter", cache_policy=NONE)
def train_drafter(
    target_dir: str,
    dataset_dir: str,
    profile: SyncProfile,
    out_dir: str,
    checkpoint_dir: str,
    *,
    warm_start_dir: str | None = None,
    verifier_name: str | None = None,
    placement: TargetPlacement | None = None,
    servers: dict[str, Any] | None = None,
    rank_devices: Sequence[int] = (),
    states_server: dict[str, Any] | None = None,
) -> Training:
    """Train (resuming from `checkpoint_dir` after a crash, warm-starting when it can) and save to `out_dir`.
    `rank_devices`: the GPUs the plan gives the torchrun ranks (none: every GPU the worker sees). Online states the
    plan gives to vLLM come from a server on `states_server` (the plan's GPUs) that stays up through training.

    The per-step curves (loss, per-position accuracy, tokens/s) go to `checkpoint_dir/history.json`, for
    the registry to log as MLflow step series.
    """
    if profile.trainer == "speculators":
        return _train_with_speculators(
            target_dir, dataset_dir, profile, out_dir, checkpoint_dir, warm_start_dir, verifier_name, servers
        )
    from draftsync.speculative.data.online_states import open_dataset
    from draftsync.speculative.methods.registry import parameter_count
    from draftsync.speculative.placement import drop_decoder_layers, shared_target
    from draftsync.speculative.targets import load_target_head
    from draftsync.speculative.train.config import TrainConfig

    online_from_vllm = profile.hidden_states == "online" and profile.hidden_states_engine == "vllm"
    if online_from_vllm:
        _check_one_process(profile)
        target = load_target_head(Path(target_dir))  # vLLM runs the layers; training reads the head
    else:
        target, _ = shared_target(Path(target_dir), placement)  # the copy the dataset read: loaded once a sync
    target_parameters = _target_parameters(target_dir, target)
    with ExitStack() as held:
        states = (
            held.enter_context(_vllm_online_states(target_dir, dataset_dir, target, states_server, checkpoint_dir))
            if online_from_vllm
            else None
        )
        # online: the target (or the vLLM server) computes each batch's states
        dataset = open_dataset(dataset_dir, target, states)
        if placement is not None and placement.on_gpu and dataset.stores_states:
            drop_decoder_layers(target)  # the GPU memory the plan gives training
        init_from = _warm_start_source(warm_start_dir, profile, target)
        config = TrainConfig.from_profile(profile, warm_start=init_from is not None)
        # async_dispatch types it as a UUID or a coroutine; called from this sync function it returns the UUID
        bar = cast(UUID, create_progress_artifact(0.0, key=None, description=f"{profile.method} drafter training"))
        # Checkpoints are kept per training config, so a sync rerun with other settings never resumes into them.
        checkpoints = Path(checkpoint_dir) / config.fingerprint(init_from is not None)
        architectures = list(target.config.architectures or ["LlamaForCausalLM"])
        out = Path(out_dir)
        if profile.train_processes > 1 or profile.train_nodes > 1:
            spec = RankSpec(
                target_dir=str(target_dir),
                dataset_dir=str(dataset_dir),
                config=asdict(config),
                out_dir=str(out),
                checkpoint_dir=str(checkpoints),
                verifier_name=verifier_name or str(target_dir),
                verifier_architectures=architectures,
                speculative_tokens=profile.gamma,
                init_from=warm_start_dir if init_from is not None else None,
                trust_remote_code=context.settings().trust_remote_code,
            )
            drafter, report = _train_on_ranks(spec, profile, Path(checkpoint_dir), rank_devices)
        else:
            drafter, report = _train_here(target, dataset, config, profile, init_from, checkpoints, bar)
            _save(drafter, out, verifier_name or str(target_dir), architectures, profile.gamma)
        own = parameter_count(drafter).own
        summary = TrainingSummary(
            method=report.method,
            steps=report.steps,
            resumed_from_step=report.resumed_from_step,
            seconds=round(report.seconds, 1),
            tokens_per_s=round(report.tokens_per_s),
            final_loss=round(report.final_loss, 4),
            top1_agreement=round(report.top1_agreement, 4),
            position_accuracy=tuple(round(a, 4) for a in report.position_accuracy),
            warm_start=init_from is not None,
            train_processes=report.world_size,
            draft_vocab_size=report.draft_vocab_size,
            parameters=own,
            parameters_pct_of_target=round(100.0 * own / target_parameters, 2),
            aux_layer_ids=tuple(drafter.aux_layer_ids) if drafter.aux_layer_ids else None,  # None: no aux states read
        )
        _write_records(summary, report, out, Path(checkpoint_dir))
        return summary


def _check_one_process(profile: SyncProfile) -> None:
    from draftsync.errors import DraftsyncError

    if profile.train_processes > 1 or profile.train_nodes > 1:
        raise DraftsyncError(
            f"online states from vLLM are read by one training process; the profile asks for "
            f"{profile.train_processes} a node on {profile.train_nodes} node(s)",
            "train with train_processes: 1, or with hidden_states: offline (vLLM writes the shards once and every "
            "rank reads them)",
        )


def _target_parameters(target_dir: str, target: Any) -> int:
    """The target's parameters: counted from its description where only its head is loaded."""
    if len(target.get_decoder().layers) == 0:
        from draftsync.speculative.target_description import describe

        return describe(Path(target_dir)).parameters
    return sum(p.numel() for p in target.parameters())


@contextmanager
def _vllm_online_states(
    target_dir: str, dataset_dir: str, target: Any, states_server: dict[str, Any] | None, work_dir: str
) -> Iterator[Any]:
    """A vLLM server answering each batch's states through the whole training, started again if it dies."""
    from draftsync.serving.vllm_args import ServerResources
    from draftsync.serving.vllm_states import VllmStateReader, aux_and_final
    from draftsync.speculative.data.hidden_states import final_norm_of, num_decoder_layers
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.vllm_connector import captured_layer_ids

    aux, layers = tuple(ShardDataset(dataset_dir).aux_layer_ids), num_decoder_layers(target)
    captured = captured_layer_ids(aux, layers)
    context.logger().info("training: each batch's hidden states (layers %s) asked of a vLLM server", list(captured))
    resources = ServerResources.from_plan(states_server)
    work = Path(work_dir) / "vllm-states"
    with VllmStateReader(target_dir, captured, work, resources=resources, restarts=ONLINE_RESTARTS) as reader:
        yield aux_and_final(reader, aux, layers, final_norm_of(target))


def _train_here(
    target, dataset, config: TrainConfig, profile: SyncProfile, init_from, checkpoints: Path, bar: UUID
) -> tuple[Any, TrainReport]:
    """`fit_drafter` in this process, its progress in the run's log and on the progress artifact `bar`."""
    import torch

    from draftsync.speculative.train.training import fit_drafter

    logger = context.logger()
    every = max(1, config.steps // 5)
    shown = max(1, config.steps // 50)  # the UI's progress bar moves in 2% steps

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        if step % every == 0 or step == total:
            logger.info(
                "drafter training step %d/%d loss %.3f, %.0f tokens/s",
                step,
                total,
                metrics["loss"],
                metrics["tokens_per_s"],
            )
        if step % shown == 0 or step == total:
            update_progress_artifact(bar, 100.0 * step / total)

    torch.manual_seed(profile.seed)
    return fit_drafter(target, dataset, config, init_from=init_from, checkpoint_dir=checkpoints, on_progress=progress)


def _save(drafter, out: Path, verifier_name: str, architectures: list[str], gamma: int) -> None:
    """The drafter in the format its server loads, naming the target it verifies against."""
    from draftsync.speculative.methods.registry import save_drafter

    save_drafter(
        drafter,
        out,
        verifier_name_or_path=verifier_name,
        verifier_architectures=architectures,
        speculative_tokens=gamma,
    )


def _write_records(summary: TrainingSummary, report: TrainReport, out: Path, checkpoint_dir: Path) -> None:
    """The summary beside the drafter, and the per-step curves as `train.<metric>` series in history.json."""
    (out / SUMMARY_FILE).write_text(json.dumps(summary.as_dict(), indent=2))
    history: dict[str, list[tuple[int, float]]] = {}
    for row in report.history:
        for key, value in row.items():
            if key != "step":
                history.setdefault(f"train.{key}", []).append((int(row["step"]), float(value)))
    checkpoint_dir.mkdir(parents=True, exist_ok=True)  # absent when checkpoint_every is 0
    (checkpoint_dir / HISTORY_FILE).write_text(json.dumps(history))
    context.logger().info("drafter trained: %s", summary.as_dict())
