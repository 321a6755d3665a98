"""`draftsync targets register`: log a Hugging Face checkpoint as the next version of a target, tagged from the
checkpoint itself, and ask for the drafter sync a webhook would.

Mounted on the main CLI as `app.add_typer(targets_app, name="targets")`. Heavy imports (torch, transformers,
mlflow, prefect) happen inside the command, after the work dir's environment is set.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from draftsync.cli.common import JsonOption, check_registry, command_group, write_json
from draftsync.errors import DraftsyncError

targets_app = command_group("Target models in the registry: register a checkpoint as a new version.")

TASK_MIX_EXAMPLE = "--task-mix code=0.5,math=0.5"


# The decision framework's name for the corpora's prose (`recommend --task chat`), so both commands take both words.
CORPUS_TASK = {"chat": "prose"}


def parse_task_mix(text: str | None, target: str) -> dict[str, float]:
    """`code=0.7,math=0.3` as {task: share}: tasks of the built-in corpora, positive shares, normalised to sum 1."""
    from draftsync.speculative.data.corpora import TASKS

    how = (
        f"pass {TASK_MIX_EXAMPLE}: TASK=SHARE pairs for tasks among {', '.join(TASKS)}, "
        "each share positive (they are normalised to sum to 1)"
    )
    if text is None or not text.strip():
        raise DraftsyncError(
            f"target {target}: no task mix given; a checkpoint does not say what traffic it serves, and a sync "
            "trains its drafter on that mix",
            how,
        )
    shares: dict[str, float] = {}
    for part in text.split(","):
        task, _, share = (piece.strip() for piece in part.partition("="))
        task = CORPUS_TASK.get(task, task)  # recommend's word for conversational text
        if task not in TASKS:
            problem = f"unknown task {task!r}"
        elif task in shares:
            problem = f"task {task!r} is given twice"
        elif not _positive(share):
            problem = f"the share of {task} ({share!r}) is not a positive number"
        else:
            shares[task] = float(share)
            continue
        raise DraftsyncError(f"target {target}: task mix {text!r}: {problem}", how)
    total = sum(shares.values())
    if not math.isfinite(total):  # 1e308 + 1e308 overflows, and every share would be stored as 0
        raise DraftsyncError(f"target {target}: task mix {text!r}: the shares add up past a float's range", how)
    return {task: share / total for task, share in sorted(shares.items())}


def _positive(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


@targets_app.command()
def register(
    checkpoint: Annotated[
        Path, typer.Argument(help="Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files).")
    ],
    name: Annotated[str, typer.Option("--name", help="Registered model name of the target.")],
    task_mix: Annotated[
        str | None,
        typer.Option(
            "--task-mix",
            help="The traffic the target serves, e.g. code=0.7,math=0.3 (tasks: code, math, prose, also called "
            "chat; normalised).",
        ),
    ] = None,
    alias: Annotated[
        str, typer.Option("--alias", help="Point this alias of the target at the new version.")
    ] = "production",
    no_sync: Annotated[bool, typer.Option("--no-sync", help="Register only: do not ask for the drafter sync.")] = False,
    flavor: Annotated[
        str,
        typer.Option(
            "--flavor",
            help="How to log it: 'checkpoint' (the directory's files as run artifacts) or 'transformers' (an "
            "MLflow transformers-flavor model, which MLflow's own tools load too).",
        ),
    ] = "checkpoint",
    json_path: JsonOption = None,
) -> None:
    """Register CHECKPOINT as the next version of target NAME, then ask for its drafter sync.

    The architecture, size, vocabulary, parameter count and family are read from the checkpoint; the model is
    loaded once on the CPU to check its config against its weights and its tokenizer against its vocabulary.
    A checkpoint draftsync cannot sync is refused and nothing is registered. The sync is requested as a webhook
    delivery requests it (event draftsync.target.version.created), so a webhook reporting the same version
    does not start a second one. CHECKPOINT may lie anywhere: a path typed here is the operator's intent, and the
    model roots (DRAFTSYNC_MODEL_ROOTS) confine only paths that arrive from elsewhere."""
    from draftsync.registry.checkpoint_checks import check_name
    from draftsync.registry.model_registry import check_alias
    from draftsync.registry.target_layouts import check_flavor

    check_name(name)  # every argument is checked before the checkpoint is loaded
    check_flavor(flavor, "--flavor")
    check_alias(alias)
    mix = parse_task_mix(task_mix, name)
    check_checkpoint(checkpoint, name)
    check_registry()
    result = register_target(checkpoint, name, mix, alias, request_sync=not no_sync, flavor=flavor)
    typer.echo(f"registered {name} version {result['version']} from {result['checkpoint']} (alias {alias})")
    for key, value in sorted(result["tags"].items()):
        typer.echo(f"  {key} = {value}")
    typer.echo(sync_line(result["sync"], name, result["version"]))
    write_json(result, json_path)


def check_checkpoint(checkpoint: Path, name: str) -> None:
    """Everything a sync will ask of the checkpoint, before anything is stored: a family draftsync trains for,
    sound weight files, a config that fits the weights and a tokenizer that fits the vocabulary."""
    import gc
    import os

    from draftsync.speculative.targets import load_target

    try:
        model, tokenizer = load_target(Path(os.path.realpath(checkpoint)))
    except DraftsyncError as error:
        raise DraftsyncError(f"{error.what}; nothing was registered as {name}", error.fix) from error
    del model, tokenizer
    gc.collect()


def register_target(
    checkpoint: Path, name: str, task_mix: dict[str, float], alias: str, *, request_sync: bool, flavor: str
) -> dict[str, Any]:
    """Publish the checked checkpoint (publish_target) and, unless told not to, request its sync."""
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from draftsync.tasks.sync_requests import request_new_version_sync

    # the task's own function: outside a flow a Prefect task run only adds a warning about its logs
    version = publish_target.fn(name, str(checkpoint), task_mix, alias, flavor=flavor, confine=False)
    sync = None
    if request_sync:
        sync = request_new_version_sync(
            name, version, source="cli", reason=f"version {version} registered by `draftsync targets register`"
        )
    return {
        "target_name": name,
        "version": version,
        "checkpoint": str(checkpoint.resolve()),
        "alias": alias,
        "flavor": flavor,
        "tags": context.registry().version_tags(name, version),
        "sync": None if sync is None else sync.as_dict(),
    }


def sync_line(sync: dict[str, Any] | None, name: str, version: int) -> str:
    if sync is None:
        return f"sync not requested (--no-sync): start it with `draftsync sync {name} {version}`"
    if sync["requested"]:
        return (
            f"sync requested ({sync['method']}, {sync['gpus']} GPU(s) of a GPU pool node): event {sync['event']} "
            "sent; the drafter-sync deployment (`draftsync serve`) runs it, or start it now with "
            f"`draftsync sync {name} {version}`"
        )
    return f"sync of {name} v{version} ({sync['method']}) was already requested or done"
