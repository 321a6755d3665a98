"""Peak memory of one EAGLE-3 training step, measured against `speculative/train/step_memory.py`'s prediction.

Each shape runs in its own process: a Llama-shaped target config (no target weights: the step needs only the target's
lm_head, randomly initialised here), a fresh EAGLE-3 drafter, a batch of random states, then two
`training.optimisation_step`s on this CPU, the function a sync trains with (the second holds AdamW's state, as
every later one does), in fp32, or in bf16 autocast with a bf16 target head (as on a GPU worker), with or without
activation checkpointing. The measured figure is the peak
resident memory (the kernel's ru_maxrss) less the resident memory before the drafter, head and batch were made, so
the interpreter and torch's libraries do not count; on CUDA it would be torch.cuda.max_memory_allocated. Prints JSON:
per shape, the prediction's parts, its total, the measurement and their ratio.

Usage: python bench/train_memory.py [--runs 1b-256:fp32,8b-2048:bf16:ckpt,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name: (hidden, layers' intermediate, heads, kv heads, vocabulary, draft vocabulary, batch, sequence length)
SHAPES = {
    "1b-256": (2048, 8192, 32, 8, 128256, 32000, 1, 256),  # Llama-3.2-1B's widths
    "1b-512": (2048, 8192, 32, 8, 128256, 32000, 1, 512),
    "3b-1024": (3072, 8192, 24, 8, 128256, 32000, 1, 1024),  # Llama-3.2-3B's
    "8b-2048": (4096, 14336, 32, 8, 128256, 32000, 1, 2048),  # Llama-3.1-8B's drafter at 2,048 tokens
}
TTT_STEPS = 4  # the production profile's
# shape:precision[:ckpt] (activation checkpointing)
RUNS = ("1b-256:fp32", "1b-512:fp32", "3b-1024:fp32", "8b-2048:fp32", "8b-2048:bf16", "8b-2048:bf16:ckpt")


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(run: str) -> dict:
    """One run, in this process (run as a child of main())."""
    import resource
    from contextlib import nullcontext

    import torch
    from draftsync.speculative.data.draft_vocab import build_draft_vocab
    from draftsync.speculative.data.training_batch import TrainingBatch
    from draftsync.speculative.methods import EAGLE3
    from draftsync.speculative.methods.registry import new_drafter
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.step_memory import BF16, FP32, StepShape, predict_step_memory
    from draftsync.speculative.train.training import optimisation_step
    from transformers import LlamaConfig

    name, precision, *options = run.split(":")
    checkpointing = "ckpt" in options
    bf16 = precision == "bf16"
    hidden, intermediate, heads, kv_heads, vocab, draft_vocab, batch, seq_len = SHAPES[name]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        num_hidden_layers=32,
        max_position_embeddings=8192,
    )
    width = BF16 if bf16 else FP32
    shape = StepShape.for_target(
        config,
        draft_vocab,
        batch,
        seq_len,
        TTT_STEPS,
        head_bytes=width,
        activation_bytes=width,
        checkpointing=checkpointing,
    )
    torch.manual_seed(0)
    torch.ones(8) @ torch.ones(8)  # torch's kernels loaded before the baseline
    baseline = _rss_bytes()

    drafter = new_drafter(EAGLE3.name, config, draft_vocab, (1, 15, 29))
    drafter.set_draft_vocab(*build_draft_vocab(torch.arange(vocab, 0, -1), draft_vocab))  # the most frequent ids
    # the frozen embedding is the target's tensor, in the target's dtype, as `initialise_from_target` shares it
    drafter.embed_tokens.weight = torch.nn.Parameter(
        torch.randn(vocab, hidden, dtype=torch.bfloat16 if bf16 else torch.float32), requires_grad=False
    )
    drafter.train()
    drafter.activation_checkpointing = checkpointing
    head = torch.nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16 if bf16 else torch.float32)
    head.requires_grad_(False)
    ids = torch.randint(0, vocab, (batch, seq_len))
    step_batch = TrainingBatch(
        ids=ids,
        valid=torch.ones(batch, seq_len, dtype=torch.bool),
        loss_mask=torch.ones(batch, seq_len, dtype=torch.bool),
        aux=torch.randn(batch, seq_len, 3 * hidden),
        final=torch.randn(batch, seq_len, hidden),
    )
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    train_config = TrainConfig(method=EAGLE3.name, ttt_steps=TTT_STEPS, device="cpu")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    for step in range(2):  # the second step is the steady state: AdamW's moments exist
        step_batch.target_logits = step_batch.target_columns = step_batch.target_top = None
        result = optimisation_step(drafter, [step_batch], head, optimizer, parameters, train_config, step, autocast)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    predicted = predict_step_memory(shape)
    measured = peak - baseline
    return {
        "run": run,
        **shape.to_dict(),
        "loss": round(float(result.total), 4),
        "predicted_gib": {part: round(value / 2**30, 3) for part, value in predicted.items()},
        "measured_gib": round(measured / 2**30, 3),
        "predicted_over_measured": round(predicted["total"] / measured, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    from bench.harness import emit_json

    rows = []
    for name in args.runs.split(","):
        child = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise SystemExit(f"run {name} failed:\n{child.stderr[-3000:]}")
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(f"{name}: predicted/measured {rows[-1]['predicted_over_measured']}", file=sys.stderr)
    emit_json({"benchmark": "train_memory", "ttt_steps": TTT_STEPS, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
