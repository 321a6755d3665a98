"""The drafter sync: dataset from the target -> train -> register with lineage -> validate -> promote.

The drafter is registered before it is validated (as a `candidate`, validation pending), so a crash
during the checklist leaves a version a rerun finds again by its sync key and validates, and the
checklist's plots and tables land on that version's run.
"""

from __future__ import annotations

import shutil

from prefect import flow, get_run_logger

from draftsync.flows.validate import validate
from draftsync.tasks import context
from draftsync.tasks.dataset import build_dataset, target_task_mix
from draftsync.tasks.drafting import HISTORY_FILE, train_drafter
from draftsync.tasks.profile import SyncProfile, profile as named_profile
from draftsync.tasks.registration import drafter_model_name, fetch_target, register_drafter


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
    version = register_drafter(target_name, target_version, str(out_dir), chosen.method, chosen.gamma, training,
                               history_path=str(checkpoints / HISTORY_FILE), data_checks=data["checks"])
    if not chosen.keep_dataset:
        shutil.rmtree(dataset_dir, ignore_errors=True)
    validation = validate(target_name, version, chosen.validation, promote=True, seed=chosen.seed)
    if not validation["passed"]:
        logger.warning("drafter %s v%d stays a candidate and does not serve", drafter_model, version)
    return {
        "target_name": target_name,
        "target_version": target_version,
        "drafter_name": drafter_model,
        "drafter_version": version,
        "method": chosen.method,
        "gamma": validation["gamma_knee"],
        "passed": validation["passed"],
        "validation": validation,
        "training": training,
        "dataset": {k: v for k, v in data.items() if k != "checks"},
        "data_checks": data["checks"],
    }
