"""The drafter sync: dataset from the target -> train -> validate -> register with lineage -> promote."""

from __future__ import annotations

import shutil

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from draftsync.tasks import context
from draftsync.tasks.dataset import build_dataset, target_task_mix
from draftsync.tasks.drafting import HISTORY_FILE, train_drafter
from draftsync.tasks.profile import SyncProfile, profile as named_profile
from draftsync.tasks.registration import drafter_model_name, fetch_target, promote_drafter, register_drafter
from draftsync.tasks.validation import validate_drafter


def _gate_table(target_name: str, target_version: int, version: int, validation: dict, training: dict) -> str:
    rows = "\n".join(
        f"| {g['name']} | {g['value']} | {g['threshold']} | {'pass' if g['passed'] else 'FAIL'} |" for g in validation["gates"]
    )
    m = validation["metrics"]
    return (
        f"# Drafter v{version} for {target_name} v{target_version}\n\n"
        f"| gate | value | threshold | verdict |\n|---|---|---|---|\n{rows}\n\n"
        f"Acceptance {m['acceptance_rate']:.3f}, mean acceptance length {m['mean_acceptance_length']:.2f}, "
        f"P5 {m['acceptance_p5']:.3f}, P50 {m['acceptance_p50']:.3f} over {m['requests']} requests.\n\n"
        f"Training: {training['steps']} steps in {training['seconds']} s ({training['tokens_per_s']} tok/s), "
        f"warm start: {training['warm_start']}, held-out top-1 agreement {training['top1_agreement']}.\n"
    )


@flow(name="drafter-sync", log_prints=True)
def sync(target_name: str, target_version: int, profile: str | SyncProfile = "demo") -> dict:
    """Train a drafter for one target version; promote it to `production` only when every gate passes."""
    logger = get_run_logger()
    chosen = named_profile(profile) if isinstance(profile, str) else profile
    registry = context.registry()
    settings = context.settings()
    target = fetch_target(target_name, target_version)
    task_mix = target_task_mix(target["path"], target["tags"])
    # One work directory per (target version, method): a rerun after a crash resumes the dataset build
    # from its last shard and the training from its last checkpoint.
    work = settings.root / "syncs" / target_name / f"v{target_version}-{chosen.method}"
    dataset_dir = work / f"dataset-{chosen.dataset_key()}"
    data = build_dataset(target["path"], task_mix, chosen, str(dataset_dir))

    drafter_model = drafter_model_name(target_name)
    previous = registry.alias_version(drafter_model, "production")
    warm_start_dir = str(registry.download(drafter_model, previous)) if previous is not None else None
    out_dir = settings.root / "drafters" / target_name / f"target-v{target_version}-{chosen.method}"
    checkpoints = work / "checkpoints"
    training = train_drafter(target["path"], data["path"], chosen, str(out_dir), str(checkpoints), warm_start_dir)
    validation = validate_drafter(target["path"], str(out_dir), task_mix, chosen)
    version = register_drafter(target_name, target_version, str(out_dir), chosen.method, chosen.gamma, validation,
                               training, history_path=str(checkpoints / HISTORY_FILE))
    if not chosen.keep_dataset:
        shutil.rmtree(dataset_dir, ignore_errors=True)
    if validation["passed"]:
        promote_drafter(target_name, version)
        logger.info("drafter %s v%d promoted to production", drafter_model, version)
    else:
        failed = [g["name"] for g in validation["gates"] if not g["passed"]]
        logger.warning("drafter %s v%d failed gates %s: it stays a candidate and does not serve", drafter_model, version, failed)
    create_markdown_artifact(
        key=f"sync-{target_name}-v{target_version}".lower().replace("_", "-").replace(".", "-"),
        markdown=_gate_table(target_name, target_version, version, validation, training),
        description="drafter sync gates",
    )
    return {
        "target_name": target_name,
        "target_version": target_version,
        "drafter_name": drafter_model,
        "drafter_version": version,
        "method": chosen.method,
        "gamma": chosen.gamma,
        "passed": validation["passed"],
        "validation": validation,
        "training": training,
        "dataset": {k: v for k, v in data.items() if k != "checks"},
        "data_checks": data["checks"],
    }
