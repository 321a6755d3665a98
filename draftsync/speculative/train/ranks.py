"""What torchrun runs on each rank of a data-parallel training: `python -m torch.distributed.run ... -m
draftsync.speculative.train.ranks SPEC.json` (`command` renders it).

Every rank loads the target's head and the dataset and trains its slice of each step; the leader saves the drafter
in the format its server loads and writes the training report beside it. A spec file, not arguments, carries the
config, so every rank reads the same one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError

REPORT_FILE = "training_report.json"


@dataclass(frozen=True)
class RankSpec:
    """One data-parallel training: what each rank reads and where the leader writes."""

    target_dir: str
    dataset_dir: str
    config: dict[str, Any]  # TrainConfig's fields
    out_dir: str
    checkpoint_dir: str | None
    verifier_name: str
    verifier_architectures: list[str]
    speculative_tokens: int
    init_from: str | None = None  # the previous drafter to warm-start from
    trust_remote_code: bool = False  # the sync's setting, passed on: a rank needs only torch and transformers

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path


RENDEZVOUS_JOIN_TIMEOUT_S = 300  # a node that cannot reach the rendezvous gives up after this, naming it


def command(
    spec_file: Path,
    processes: int,
    nodes: int = 1,
    rendezvous: str | None = None,
    join_timeout_s: int = RENDEZVOUS_JOIN_TIMEOUT_S,
) -> list[str]:
    """torchrun with `processes` ranks on each of `nodes` machines: on one, its standalone rendezvous on a free local
    port; on several, c10d at `rendezvous` (HOST:PORT of the first node), each node running this same command."""
    if nodes == 1:
        launch = ["--standalone", f"--nproc-per-node={processes}"]
    else:
        launch = [
            f"--nnodes={nodes}",
            f"--nproc-per-node={processes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rendezvous}",
            f"--rdzv-id={spec_file.parent.name or 'draftsync'}",
            f"--rdzv-conf=join_timeout={join_timeout_s},read_timeout={join_timeout_s}",
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launch,
        "-m",
        RankSpec.__module__,  # this module, by name (run as __main__ it would not know it)
        str(spec_file),
    ]


def rank_environment(devices: Sequence[int], parent: Mapping[str, str]) -> dict[str, str]:
    """The ranks see only the plan's GPUs (`devices`, as the worker numbers them), so LOCAL_RANK i trains on the
    plan's i-th GPU and no rank lands on a GPU serving or the target holds; none given: the worker's own."""
    from draftsync.speculative.placement import visible_devices

    if not devices:
        return {}
    return {"CUDA_VISIBLE_DEVICES": visible_devices(devices, parent, "the training ranks")}


def launch(
    spec_file: Path,
    processes: int,
    log: Path,
    nodes: int = 1,
    rendezvous: str | None = None,
    join_timeout_s: int = RENDEZVOUS_JOIN_TIMEOUT_S,
    devices: Sequence[int] = (),
) -> None:
    """Run this node's share of the job under torchrun on the plan's GPUs (`devices`) and wait for it, its output in
    `log`. A node that is not the rendezvous's host first waits, at most `join_timeout_s`, for the endpoint to answer;
    a job whose nodes do not all join fails in the same time. Both failures name the endpoint."""
    if nodes > 1:
        if not rendezvous:
            raise DraftsyncError(
                f"a {nodes}-node training has no rendezvous endpoint", "set train_rendezvous to HOST:PORT of node 0"
            )
        wait_for_rendezvous(rendezvous, join_timeout_s)
    argv = command(spec_file, processes, nodes, rendezvous, join_timeout_s)
    environment = {**os.environ, **rank_environment(devices, os.environ)}  # refused here when the worker lacks them
    with log.open("w") as output:
        done = subprocess.run(argv, stdout=output, stderr=subprocess.STDOUT, check=False, env=environment)
    if done.returncode == 0:
        return
    text = log.read_text()
    if "RendezvousTimeoutError" in text or "RendezvousConnectionError" in text:
        raise DraftsyncError(
            f"the {nodes} nodes of the training did not all join the rendezvous at {rendezvous} within "
            f"{join_timeout_s} s",
            f"start the same training on every node, each able to reach {rendezvous}; read {log}",
        )
    tail = text.strip().splitlines()[-1:] or ["no output"]
    raise DraftsyncError(
        f"data-parallel training on {processes * nodes} ranks failed (exit {done.returncode}): {tail[0][:300]}",
        f"read {log}; a checkpoint written before the failure resumes on the next run, on any number of ranks",
    )


def wait_for_rendezvous(endpoint: str, timeout_s: float) -> None:
    """Until `endpoint` (HOST:PORT) accepts a connection, at most `timeout_s`; this machine's own endpoint is where
    torchrun will start the rendezvous, so there is nothing to wait for."""
    from draftsync.profiles import host_and_port

    address = host_and_port(endpoint)
    if address is None:
        raise DraftsyncError(
            f"rendezvous endpoint {endpoint!r} is not HOST:PORT", "give the first node's address, e.g. node-0:29400"
        )
    host, port = address
    if _is_this_machine(host):
        return
    deadline = time.monotonic() + timeout_s
    why = "no answer"
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as error:
            why = error.strerror or type(error).__name__
        if time.monotonic() >= deadline:
            raise DraftsyncError(
                f"the training's rendezvous at {endpoint} could not be reached within {timeout_s:g} s ({why})",
                f"start the first node's training (it holds the rendezvous); check that this node reaches {endpoint}",
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _is_this_machine(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(mine & theirs)


def main(spec_file: str) -> None:
    import torch

    from draftsync.speculative.data.online_states import open_dataset
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.methods.registry import load_drafter, save_drafter
    from draftsync.speculative.placement import TargetPlacement, from_pretrained_options
    from draftsync.speculative.target_description import read_target_config
    from draftsync.speculative.targets import load_target, load_target_head
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.data_parallel import Ranks, start, stop
    from draftsync.speculative.train.training import fit_drafter

    spec = RankSpec(**json.loads(Path(spec_file).read_text()))
    ranks = Ranks.from_environment()
    fields: dict[str, Any] = dict(spec.config)
    fields["device"] = ranks.device_name(fields.get("device", "auto"))
    if fields.get("aux_layer_ids") is not None:  # JSON gave a list
        fields["aux_layer_ids"] = tuple(fields["aux_layer_ids"])
    config = TrainConfig(**fields)
    start(ranks, torch.device(config.device))
    try:
        target_dir = Path(spec.target_dir)
        # a rank on a GPU holds the target in its 16-bit dtype there; on a CPU in fp32
        placement = TargetPlacement((config.device,)) if config.device.startswith("cuda") else TargetPlacement()
        options = from_pretrained_options(read_target_config(target_dir), placement)
        if ShardDataset(spec.dataset_dir).stores_states:
            # training reads only the head, embedding and final norm
            target = load_target_head(target_dir, options, spec.trust_remote_code)
        else:
            # it computes each batch's states
            target, _ = load_target(target_dir, spec.trust_remote_code, load_options=options)
        dataset = open_dataset(spec.dataset_dir, target)
        init_from = load_drafter(Path(spec.init_from)) if spec.init_from else None
        torch.manual_seed(config.seed)
        drafter, report = fit_drafter(
            target,
            dataset,
            config,
            init_from=init_from,
            checkpoint_dir=spec.checkpoint_dir,
            ranks=ranks,
        )
        if ranks.leader:
            out = Path(spec.out_dir)
            save_drafter(
                drafter,
                out,
                verifier_name_or_path=spec.verifier_name,
                verifier_architectures=spec.verifier_architectures,
                speculative_tokens=spec.speculative_tokens,
            )
            (out / REPORT_FILE).write_text(json.dumps(asdict(report)))
    finally:
        stop()


if __name__ == "__main__":
    main(sys.argv[1])
