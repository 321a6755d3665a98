"""The commands draftsync renders for `speculators` (train/speculators.py), checked against the installed package.

- `speculators prepare-data` / `generate-offline-data`: parsed by speculators' own click commands;
- the training flags: resolved by speculators' `TrainConfig.resolve` (its argparse and its validators),
  and the resolved values compared with the job's;
- the torchrun launcher: parsed by torch's own `torchrun` parser;
- `speculators train ... --dry-run` actually run for an eagle3 and an eagle3.1 job on a tiny target: the
  checkpoint it writes must load with `load_eagle3` as the job's method, with full attention, one layer
  and the draft vocabulary draftsync would have chosen from the same token counts.
vLLM is not installed here, so the `vllm serve` command is checked only for its JSON and layer ids.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path


def _click_command(name: str):
    from speculators.cli import app
    from typer.main import get_command

    return get_command(app).commands[name]


def _parse_click(command: list[str]) -> dict:
    """Parse a `speculators <sub> ...` argv with speculators' own command; the parsed parameters."""
    assert command[0] == "speculators"
    context = _click_command(command[1]).make_context(command[1], list(command[2:]))
    return dict(context.params)


def _resolve_train(args: list[str]):
    from speculators.train.config import TrainConfig

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return TrainConfig.resolve(list(args)).flatten(), None
        except SystemExit:
            return None, stderr.getvalue().strip().splitlines()[-1:]


def _split_train(command: list[str]) -> tuple[list[str] | None, list[str]]:
    """(torchrun launcher args or None, speculators train args)."""
    if command[:2] == ["speculators", "train"]:
        return None, command[2:]
    module = command.index("-m")
    return command[1:module], command[module + 2 :]


def check_job(job) -> dict:
    from draftsync.speculative.train import speculators as backend

    problems: list[str] = []
    prepare = _parse_click(backend.prepare_data_command(job))
    if prepare["data"] != list(job.data) or prepare["output"] != job.prepared_dir or prepare["model"] != job.target:
        problems.append(f"prepare-data parsed as {prepare}")
    if prepare["skip_token_freq"] != (job.draft_vocab_size is None):
        problems.append("prepare-data: token frequencies not written for a draft vocabulary")
    generate = _parse_click(backend.generate_hidden_states_command(job))
    if generate["preprocessed_data"] != job.prepared_dir or not generate["endpoint"].endswith("/v1"):
        problems.append(f"generate-offline-data parsed as {generate}")

    command = backend.train_command(job)
    launcher, args = _split_train(command)
    flat, error = _resolve_train(args)
    if flat is None:
        problems.append(f"speculators train refused the flags: {error}")
    else:
        expected = {
            "verifier_name_or_path": job.target,
            "speculator_type": "eagle3",
            "data_path": job.prepared_dir,
            "save_path": job.output_dir,
            "target_layer_ids": list(backend.aux_layer_ids(job)),
            "fc_norm": job.method == "eagle3.1",
            "norm_output": job.method == "eagle3.1",
            "norm_before_fc": False,
            "norm_before_residual": job.norm_before_residual,
            "draft_vocab_size": job.draft_vocab_size,
            "ttt_steps": job.ttt_steps,
            "epochs": job.epochs,
            "lr": job.lr,
            "total_seq_len": job.total_seq_len,
            "seed": job.seed,
            "on_missing": "raise",
            "from_pretrained": job.from_pretrained or "",
        }
        if not job.from_pretrained:
            expected.update({"num_layers": 1, "draft_arch": "llama", "full_attention_indices": [0]})
        wrong = {key: (flat.get(key), value) for key, value in expected.items() if flat.get(key) != value}
        if wrong:
            problems.append(f"speculators train resolved (got, wanted): {wrong}")
    if launcher is not None:
        from torch.distributed.run import get_args_parser

        parsed = get_args_parser().parse_args([*launcher, "-m", backend.TRAIN_MODULE, *args])
        nodes_ok = (
            parsed.standalone
            if job.nnodes == 1
            else (
                parsed.nnodes == str(job.nnodes)
                and parsed.rdzv_backend == "c10d"
                and parsed.rdzv_endpoint == job.rdzv_endpoint
            )
        )  # standalone reads as nnodes "1:1"
        if (
            not nodes_ok
            or parsed.nproc_per_node != str(job.gpus_per_node)
            or not parsed.module
            or parsed.training_script != backend.TRAIN_MODULE
            or parsed.training_script_args != args
        ):
            problems.append(f"torchrun parsed as {vars(parsed)}")

    server = backend.hidden_state_server_command(job)
    speculative = json.loads(server[server.index("--speculative-config") + 1])
    ids = speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
    if ids != [*sorted(backend.aux_layer_ids(job)), backend.target_num_layers(job)]:
        problems.append(f"vllm serve extracts layers {ids}")
    return {"command": command, "problems": problems, "ok": not problems}


def _tiny_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer over the target's ids: speculators' trainer resolves a mask token from it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<unk>").save_pretrained(directory)


def dry_run(job, counts, env: dict[str, str]) -> dict:
    """`speculators train ... --dry-run` as rendered, then the checkpoint read back by draftsync."""
    import torch
    from draftsync.speculative.data.draft_vocab import build_draft_vocab
    from draftsync.speculative.methods.eagle3.checkpoint import load_eagle3
    from draftsync.speculative.train import speculators as backend

    prepared = Path(job.prepared_dir)
    prepared.mkdir(parents=True, exist_ok=True)
    torch.save({i: int(c) for i, c in enumerate(counts.tolist()) if c > 0}, prepared / "token_freq.pt")
    lines: list[str] = []
    command = [*backend.train_command(job), "--dry-run"]
    try:
        backend.run_commands([command], env=env, on_line=lines.append)
    except Exception as error:  # noqa: BLE001 - reported in the JSON
        return {"ok": False, "error": str(error), "output_tail": lines[-15:]}
    config = json.loads((Path(job.output_dir) / "config.json").read_text())
    drafter = load_eagle3(job.output_dir)
    d2t, _ = build_draft_vocab(counts, job.draft_vocab_size)
    layer = config["transformer_layer_config"]
    result = {
        "loaded_method": drafter.method,
        "num_hidden_layers": layer.get("num_hidden_layers"),
        "layer_types": layer.get("layer_types"),
        "draft_vocab_matches_draftsync": bool(torch.equal(drafter.d2t, d2t)),
        "aux_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
    }
    result["ok"] = (
        result["loaded_method"] == job.method
        and result["num_hidden_layers"] == 1
        and result["layer_types"] in (None, ["full_attention"])
        and result["draft_vocab_matches_draftsync"]
        and result["aux_layer_ids"] == list(backend.aux_layer_ids(job))
    )
    return result


def check_rendered_commands(work: Path, target_dir: Path, vocab_size: int) -> dict:
    import torch
    from draftsync.speculative.train.speculators import SpeculatorsTrainJob

    odd = work / "data dir; $(touch x) & 'q'"
    jobs = {
        "1-gpu-eagle3": SpeculatorsTrainJob(
            target=str(target_dir),
            data=(str(work / "rows.jsonl"),),
            work_dir=str(work / "job1"),
            output_dir=str(work / "job1-out"),
            draft_vocab_size=96,
            epochs=2,
            ttt_steps=2,
        ),
        "8-gpu-eagle3.1": SpeculatorsTrainJob(
            target=str(target_dir),
            data=(str(odd / "a.jsonl"), str(odd / "b.jsonl")),
            work_dir=str(odd / "work"),
            output_dir=str(work / "job2-out"),
            method="eagle3.1",
            draft_vocab_size=96,
            aux_layer_ids=(0, 2, 3),
            gpus_per_node=8,
            lr=2e-4,
        ),
        "2x8-gpu-warm-start": SpeculatorsTrainJob(
            target=str(target_dir),
            data=(str(work / "chats"),),
            work_dir=str(work / "job3"),
            output_dir=str(work / "job3-out"),
            method="eagle3.1",
            conversations=True,
            from_pretrained=str(work / "previous"),
            gpus_per_node=8,
            nnodes=2,
            rdzv_endpoint="node0:29400",
        ),
    }
    results = {name: check_job(job) for name, job in jobs.items()}

    _tiny_tokenizer(target_dir, vocab_size)
    counts = torch.randint(0, 6, (vocab_size,), generator=torch.Generator().manual_seed(3))  # many ties
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for method in ("eagle3", "eagle3.1"):
        job = SpeculatorsTrainJob(
            target=str(target_dir),
            data=(str(work / "rows.jsonl"),),
            work_dir=str(work / f"dry-{method}"),
            output_dir=str(work / f"dry-{method}-out"),
            method=method,
            draft_vocab_size=96,
        )
        results[f"dry-run-{method}"] = dry_run(job, counts, env)
    results["ok"] = all(result["ok"] for result in results.values())
    return results
