"""Host memory a training rank spends on the target: loaded whole and its layers dropped, against only its head.

A random-weight Llama-shaped checkpoint (bf16 files, as published checkpoints are) is written once; each loader then
runs in its own process and loads it in fp32 on this CPU, as a CPU rank does. Measured: the peak resident memory
(ru_maxrss) less the resident memory before the load, so the interpreter and torch's libraries do not count; and
the bytes of the tensors the loaded model keeps. Prints JSON.

Usage: python bench/target_head_memory.py [--hidden 1024] [--layers 24] [--vocab 32000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import json, resource, sys
from pathlib import Path
import torch
from draftsync.speculative.targets import load_target, load_target_head, without_decoder_layers

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

before = rss_kib()
path = Path(sys.argv[2])
if sys.argv[1] == "whole":
    model = without_decoder_layers(load_target(path)[0])
else:
    model = load_target_head(path)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kept = sum(t.numel() * t.element_size() for t in model.state_dict().values())
print(json.dumps({"peak_gib": (peak - before) / 2**20, "kept_gib": kept / 2**30}))
"""


def write_checkpoint(directory: Path, hidden: int, layers: int, vocab: int) -> int:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 256,
        max_position_embeddings=2048,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from bench.harness import emit_json, machine_facts

    load_at_start = round(os.getloadavg()[0], 2)

    with tempfile.TemporaryDirectory(prefix="target-head-") as folder:
        directory = Path(folder) / "target"
        parameters = write_checkpoint(directory, args.hidden, args.layers, args.vocab)
        tokenizer_source = ROOT / "draftsync" / "speculative" / "builtin" / "shipped" / "test-llama-v1"
        for file in tokenizer_source.glob("tokenizer*"):
            (directory / file.name).write_bytes(file.read_bytes())
        runs = {}
        for loader in ("whole", "head"):
            done = subprocess.run(
                [sys.executable, "-c", CHILD, loader, str(directory)], capture_output=True, text=True, check=True
            )
            runs[loader] = json.loads(done.stdout.strip().splitlines()[-1])
    result = {
        "machine": machine_facts(load_at_start, ("torch", "transformers")),
        "shape": {"hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "parameters": parameters},
        "whole_then_dropped": runs["whole"],
        "head_only": runs["head"],
        "peak_ratio_head_to_whole": round(runs["head"]["peak_gib"] / runs["whole"]["peak_gib"], 3),
    }
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
