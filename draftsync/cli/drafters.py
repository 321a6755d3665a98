"""`draftsync sync` and `draftsync validate`: train a drafter for a target version, and run its checklist."""

from __future__ import annotations

from typing import Annotated, get_args

import typer

from draftsync.cli.common import JsonOption, ProfileOption, check_registry, echo_json, write_json
from draftsync.profiles import EvaluationBackend
from draftsync.registry.model_registry import MAX_VERSION
from draftsync.speculative.methods import TRAINED_METHODS, method_named


def sync(
    target: Annotated[str, typer.Argument(help="Registered model name of the target.")],
    version: Annotated[int, typer.Argument(min=1, max=MAX_VERSION, help="Target version to train a drafter for.")],
    profile: ProfileOption = "demo",
    method: Annotated[
        str | None,
        typer.Option(help=f"Drafter method: {', '.join(TRAINED_METHODS)} (default: the profile's)."),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option(
            "--block-size",
            help="DFlash: positions of one drafted block, 2-16; it drafts up to block_size - 1 tokens a step "
            "(default: the profile's).",
        ),
    ] = None,
    retrain: Annotated[
        bool, typer.Option("--retrain", help="Train again even though this version was synced (a new drafter version).")
    ] = False,
    json_path: JsonOption = None,
) -> None:
    """Train, validate, register and (when it passes) promote a drafter for one target version.

    A version already synced with this method is skipped (the result says `skipped`) unless --retrain."""
    from draftsync.flows.sync import sync as sync_flow
    from draftsync.profiles import profile as named_profile
    from draftsync.profiles import with_changes

    chosen = named_profile(profile)
    if method is not None:
        method_named(method, among=TRAINED_METHODS)
    changes = {"method": method, "block_size": block_size}
    if any(value is not None for value in changes.values()):
        options = {key: value for key, value in changes.items() if value is not None}
        chosen = with_changes(chosen, f"sync --profile {profile} with {options}", **options)
    check_registry()
    from draftsync.tasks import context

    # an unknown target or version is refused here, before the ledger records a sync that could never run
    context.registry().version_info(target, version)
    if retrain:
        from draftsync.tasks.sync_requests import sync_method

        method = sync_method(target, version, chosen.method)
        context.sync_ledger().request(target, version, method, source="cli", reason="retrain by hand", retrain=True)
    result = sync_flow(target_name=target, target_version=version, profile=chosen, reason="started by hand")
    echo_json(result)
    write_json(result, json_path)


def validate(
    target: Annotated[str, typer.Argument(help="Registered model name of the target.")],
    drafter_version: Annotated[
        int, typer.Argument(min=1, max=MAX_VERSION, help="Version of the target's drafter (<target>-drafter).")
    ],
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="Checklist profile: 'production' (1000 requests, 3x QPS, 4K-token outputs), "
            "'demo' (scaled to a 2-core CPU) or 'test'.",
        ),
    ] = "demo",
    target_version: Annotated[
        int | None,
        typer.Option(
            "--target-version", help="Validate against this target version (default: the one it was trained for)."
        ),
    ] = None,
    promote: Annotated[
        bool, typer.Option("--promote", help="Make the drafter `production` if every gate passes.")
    ] = False,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            callback=_known_backend,
            help="'vllm' (real vLLM servers), 'reference' (the CPU reference engine) or 'auto' (vLLM when installed); "
            "default: the profile's.",
        ),
    ] = None,
    json_path: JsonOption = None,
) -> None:
    """Run the validation checklist and benchmarks on a drafter version; exit 1 when a gate fails."""
    from draftsync.flows.validate import validate as validate_flow
    from draftsync.profiles import validation_profile
    from draftsync.registry.model_registry import drafter_model_name
    from draftsync.tasks import context

    chosen = validation_profile(profile)
    check_registry()
    # an unknown target or drafter version is refused here, not after the flow has started
    context.registry().version_info(drafter_model_name(target), drafter_version)
    if target_version is not None:
        context.registry().version_info(target, target_version)
    result = validate_flow(
        target_name=target,
        drafter_version=drafter_version,
        profile=chosen,
        target_version=target_version,
        promote=promote,
        backend=backend,
    )
    write_json(result.as_dict(), json_path)
    checklist = result.checklist
    for gate in checklist.gates:
        mark = "pass" if gate.passed else "FAIL"
        typer.echo(f"{mark:4}  {gate.name:38} {gate.reported_value!s:>10} {gate.comparison} {gate.threshold}")
    typer.echo(
        f"gamma knee {checklist.gamma_knee}; speedup {checklist.speedup:.2f}x; "
        f"{'PASSED' if result.passed else 'FAILED'} ({result.reports_dir})"
    )
    if not result.passed:
        raise typer.Exit(code=1)


def _known_backend(value: str | None) -> str | None:
    """An unknown backend is a usage error before any work (downloads, servers)."""
    known = get_args(EvaluationBackend)
    if value is not None and value not in known:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, known))}")
    return value
