"""The sync's ML path on a GPU: a Llama-3-shaped target of about 1B parameters in bf16, its hidden states, and an
EAGLE-3 drafter trained on them on CUDA in bf16, with measured against predicted peak memory and tokens/s.

For a GPU machine that has only torch and transformers (no network, vLLM, Prefect or MLflow): the target is randomly
initialised (Llama-3.2-1B's widths), its states are taken in memory by the same capture a sync uses, and the drafter
trains through `training.optimisation_step`, the function a sync trains with, in micro-batches of the plan's token
budget. Prints JSON. On a CPU, `--tiny` runs the same path at toy shapes (the test suite does, so it does not rot).

Usage: python bench/gpu_check.py [--steps 300] [--tiny] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))

# Llama-3.2-1B's widths (1.24B parameters with its tied embedding); the tiny shape keeps its proportions
FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=128256)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1024)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tiny", action="store_true", help="toy shapes, on the CPU when there is no GPU")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from harness import emit_json

    emit_json(run(args.steps, args.tiny), args.json)


def run(steps: int, tiny: bool) -> dict:
    import torch
    from draftsync.speculative.data.draft_vocab import build_draft_vocab
    from draftsync.speculative.data.hidden_states import capture, default_aux_layer_ids
    from draftsync.speculative.data.training_batch import TrainingBatch
    from draftsync.speculative.methods import EAGLE3
    from draftsync.speculative.methods.registry import new_drafter
    from draftsync.speculative.train.step_memory import BF16, FP32, StepShape, predict_step_memory
    from draftsync.speculative.train.training import TrainConfig, optimisation_step
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    if not cuda and not tiny:
        raise SystemExit("no CUDA device: run on a GPU machine, or with --tiny on a CPU")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = TINY if tiny else FULL
    windows, seq_len, draft_vocab, ttt = (8, 64, 256, 2) if tiny else (16, 2048, 32000, 4)
    batch_tokens = windows * seq_len // 2  # two micro-batches a step: the accumulation path runs too
    config = LlamaConfig(**shape, max_position_embeddings=8192, tie_word_embeddings=True)
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        target = LlamaForCausalLM(config).to(dtype).eval()
    parameters = sum(p.numel() for p in target.parameters())
    layers = default_aux_layer_ids(config.num_hidden_layers)

    # the target's states for a pool of sequences, kept in memory as the shards would hold them
    pool = 4 * windows
    ids = torch.randint(0, config.vocab_size, (pool, seq_len), device=device)
    aux_parts, final_parts = [], []
    if cuda:
        torch.cuda.synchronize()
    states_started = time.perf_counter()
    for begin in range(0, pool, 2):
        states = capture(target, ids[begin : begin + 2], layers, all_logits=False)
        aux_parts.append(states.aux.to(torch.bfloat16))
        final_parts.append(states.final.to(torch.bfloat16))
    if cuda:
        torch.cuda.synchronize()
    states_seconds = time.perf_counter() - states_started
    aux, final = torch.cat(aux_parts), torch.cat(final_parts)
    head = target.get_output_embeddings()
    embedding = target.get_input_embeddings().weight.detach().clone()
    del target, aux_parts, final_parts, states
    if cuda:
        torch.cuda.empty_cache()

    drafter = new_drafter(EAGLE3.name, config, draft_vocab, layers)
    drafter.set_draft_vocab(*build_draft_vocab(torch.arange(config.vocab_size, 0, -1), draft_vocab))
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(embedding.float())
    del embedding
    drafter.embed_tokens.weight.requires_grad_(False)
    drafter.to(device).train()
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.0)
    train_config = TrainConfig(method=EAGLE3.name, ttt_steps=ttt, device=str(device), batch_tokens=batch_tokens)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    mask = torch.ones(windows, seq_len, dtype=torch.bool, device=device)

    def micro_batches(step: int) -> list[TrainingBatch]:
        rows = torch.randperm(pool, generator=torch.Generator().manual_seed(step))[:windows].to(device)
        half = windows // 2
        return [
            TrainingBatch(
                ids=ids[part], valid=mask[:half], loss_mask=mask[:half], aux=aux[part].float(), final=final[part]
            )
            for part in (rows[:half], rows[half:])
        ]

    losses = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    train_started = time.perf_counter()
    for step in range(steps):
        result = optimisation_step(
            drafter, micro_batches(step), head, optimizer, trainable, train_config, step, autocast
        )
        losses.append(float(result.total))
    if cuda:
        torch.cuda.synchronize()
    train_seconds = time.perf_counter() - train_started
    width = BF16 if cuda else FP32
    predicted = predict_step_memory(
        StepShape.for_target(config, draft_vocab, windows // 2, seq_len, ttt, head_bytes=width, activation_bytes=width)
    )
    held = (aux.numel() + final.numel()) * 2 + ids.numel() * 8  # the in-memory states pool, not part of a step
    measured = torch.cuda.max_memory_allocated() - held if cuda else None
    return {
        "benchmark": "gpu_check",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "target_parameters": parameters,
        "target_dtype": str(dtype),
        "aux_layers": list(layers),
        "hidden_states_tokens_per_s": round(pool * seq_len / states_seconds),
        "steps": steps,
        "micro_batches_per_step": 2,
        "micro_batch_tokens": batch_tokens,
        "ttt_steps": ttt,
        "train_tokens_per_s": round(steps * windows * seq_len / train_seconds),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4) if losses else None,
        "predicted_step_gib": round(predicted["total"] / 2**30, 3),
        "predicted_parts_gib": {k: round(v / 2**30, 3) for k, v in predicted.items() if k != "total"},
        "measured_step_gib": None if measured is None else round(measured / 2**30, 3),
        "predicted_over_measured": None if measured is None else round(predicted["total"] / measured, 3),
        "seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    main()
