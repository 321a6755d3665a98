"""What torchrun runs on each rank of a data-parallel training: `python -m torch.distributed.run ... -m
draftsync.speculative.train_ranks SPEC.json` (`command` renders it).

Every rank loads the target's head and the dataset and trains its slice of each step; the leader saves the drafter
in the format its server loads and writes the training report beside it. A spec file, not arguments, carries the
config, so every rank reads the same one.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path


RENDEZVOUS_JOIN_TIMEOUT_S = 300  # a node that cannot reach the rendezvous gives up after this, naming it


def command(spec_file: Path, processes: int, nodes: int = 1, rendezvous: str | None = None) -> list[str]:
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
            f"--rdzv-conf=join_timeout={RENDEZVOUS_JOIN_TIMEOUT_S}",
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


def main(spec_file: str) -> None:
    import torch

    from draftsync.speculative.data_parallel import Ranks, start, stop
    from draftsync.speculative.drafters import load_drafter, save_drafter
    from draftsync.speculative.online_states import open_dataset
    from draftsync.speculative.placement import drop_decoder_layers
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.training import TrainConfig, train_drafter

    spec = RankSpec(**json.loads(Path(spec_file).read_text()))
    ranks = Ranks.from_environment()
    fields: dict[str, Any] = dict(spec.config)
    fields["device"] = ranks.device_name(fields.get("device", "auto"))
    if fields.get("aux_layer_ids") is not None:  # JSON gave a list
        fields["aux_layer_ids"] = tuple(fields["aux_layer_ids"])
    config = TrainConfig(**fields)
    start(ranks, torch.device(config.device))
    try:
        target, _ = load_target(Path(spec.target_dir))
        dataset = open_dataset(spec.dataset_dir, target)
        if dataset.stores_states:
            drop_decoder_layers(target)  # training reads only the head, the embedding and the final norm
        init_from = load_drafter(Path(spec.init_from)) if spec.init_from else None
        torch.manual_seed(config.seed)
        drafter, report = train_drafter(
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
