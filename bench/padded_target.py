"""A weight-bound target for the vLLM speedup benchmark: a trained built-in target padded with work that changes
nothing it computes.

Speculative decoding pays where a decode step is bound by reading the target's weights, so a verify pass of
gamma + 1 tokens costs about one plain step. The built-in targets are a few MB, which a CPU reads from its caches:
their steps are bound by fixed per-step costs instead. This pads one (demo size, v2 by default) to hundreds of MB:
- **wider**: every MLP gets extra units, gate and up rows random (the work is real), their down_proj columns
  exactly zero, so the MLP's output is unchanged;
- **deeper**: decoder layers are appended whose o_proj and down_proj are zero (q, k, v, gate and up random), so
  each adds exactly nothing to the residual stream: the last hidden state, the logits and every hidden state up to
  the base's last layer are the base target's.
So the drafters trained on the base target's states (at the same aux layer ids, which their checkpoints name)
stay valid for it, and need no training. The outputs are the base's up to float32 rounding: the wider MLPs sum the
same products in a different order (tests/unit/bench/test_padded_target.py bounds the difference and checks the
greedy tokens).

The build is reproducible (seeded), cached under a hash of its recipe as build_target caches a built-in target,
and made at benchmark time: it is never committed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

# Bump when the construction changes: a cached build of an older one is then rebuilt.
CONSTRUCTION_VERSION = 1
PADDING_FILE = "padding.json"
# Files of the base checkpoint that are not copied: the weights and config are written anew, the build record and
# the shipped manifest describe the base, not this checkpoint.
NOT_COPIED = ("config.json", "draftsync_target.json", "shipped.json")


@dataclass(frozen=True)
class PaddedRecipe:
    """A built-in target (size, version) padded to `intermediate_size` MLP units and `num_layers` decoder layers."""

    size: str = "demo"
    version: int = 2
    intermediate_size: int = 8192
    num_layers: int = 12
    seed: int = 0

    def base(self):
        from draftsync.speculative.builtin.targets import builtin_recipe

        return builtin_recipe(self.version, self.size)

    def key(self) -> str:
        payload = {**asdict(self), "base": self.base().key(), "construction": CONSTRUCTION_VERSION}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# demo-v2 padded to 8192 MLP units and 12 layers: about 319 MB of float32 weights (demo-v2 itself is 17 MB). The
# drafters read layers 1..3, all within the base's 4; the KV cache grows 3x per token, still small at these lengths.
WEIGHT_BOUND = PaddedRecipe()


def padded_state_dict(base_state: dict, base_config: dict, intermediate_size: int, num_layers: int, seed: int):
    """The padded checkpoint's tensors from the base's (the module docstring): base tensors copied, extra MLP units
    and appended layers drawn from a seeded generator at the base's initializer scale, their outputs zero."""
    import torch

    base_layers = int(base_config["num_hidden_layers"])
    base_units = int(base_config["intermediate_size"])
    if intermediate_size < base_units or num_layers < base_layers:
        raise ValueError(
            f"padding narrows the target: {intermediate_size} units < {base_units} or {num_layers} layers < "
            f"{base_layers}"
        )
    generator = torch.Generator().manual_seed(seed)
    std = float(base_config.get("initializer_range", 0.02))
    extra = intermediate_size - base_units

    def random(*shape: int, dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(dtype)

    out: dict[str, torch.Tensor] = {}
    for name, tensor in base_state.items():
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):  # [units, hidden]: more rows
            tensor = torch.cat([tensor, random(extra, tensor.shape[1], dtype=tensor.dtype)])
        elif name.endswith("mlp.down_proj.weight"):  # [hidden, units]: zero columns for the new units
            tensor = torch.cat([tensor, torch.zeros(tensor.shape[0], extra, dtype=tensor.dtype)], dim=1)
        out[name] = tensor.contiguous()
    template = f"model.layers.{base_layers - 1}."
    layer_names = [name for name in out if name.startswith(template)]
    for layer in range(base_layers, num_layers):
        for name in layer_names:
            shape, dtype = out[name].shape, out[name].dtype
            new_name = f"model.layers.{layer}." + name[len(template) :]
            if ".o_proj." in name or ".down_proj." in name:  # the layer's two writes to the residual stream
                out[new_name] = torch.zeros(shape, dtype=dtype)
            elif "norm" in name:
                out[new_name] = torch.ones(shape, dtype=dtype)
            else:
                out[new_name] = random(*shape, dtype=dtype)
    return out


def padded_config(base_config: dict, intermediate_size: int, num_layers: int) -> dict:
    config = {**base_config, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers}
    if isinstance(config.get("layer_types"), list):  # families that name each layer's attention
        types = config["layer_types"]
        config["layer_types"] = types + [types[-1]] * (num_layers - len(types))
    return config


def pad_checkpoint(base_dir: Path, out_dir: Path, intermediate_size: int, num_layers: int, seed: int) -> None:
    """Write the padded checkpoint of `base_dir` into the empty folder `out_dir`, with the base's tokenizer."""
    from safetensors.torch import load_file, save_file

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base_config = json.loads((base_dir / "config.json").read_text())
    shards = sorted(base_dir.glob("*.safetensors"))
    if len(shards) != 1:
        raise ValueError(f"{base_dir} holds {len(shards)} safetensors files; padding reads a single-file checkpoint")
    tensors = padded_state_dict(load_file(str(shards[0])), base_config, intermediate_size, num_layers, seed)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = padded_config(base_config, intermediate_size, num_layers)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in base_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in NOT_COPIED:
            shutil.copy2(path, out_dir / path.name)


def build_padded_target(recipe: PaddedRecipe, cache_dir: Path) -> Path:
    """The padded target's checkpoint dir: cached under the recipe's key, else built from the base target (itself
    built or copied by build_target into the same cache). Its padding.json, written last, records the recipe."""
    from draftsync.files import publish_directory
    from draftsync.speculative.builtin.targets import build_target
    from draftsync.speculative.targets import TARGET_INFO_FILE

    cache_dir = Path(cache_dir)
    out = cache_dir / f"padded-{recipe.key()}"
    if (out / PADDING_FILE).exists():
        return out
    base_dir = build_target(recipe.base(), cache_dir)

    def build(staging: Path) -> None:
        pad_checkpoint(base_dir, staging, recipe.intermediate_size, recipe.num_layers, recipe.seed)
        record = {
            "padded_from": {"size": recipe.size, "version": recipe.version, "recipe_key": recipe.base().key()},
            "recipe": asdict(recipe),
            "recipe_key": recipe.key(),
            "construction_version": CONSTRUCTION_VERSION,
            "weight_bytes": weight_bytes(staging),
            "base_weight_bytes": weight_bytes(base_dir),
        }
        base_info = base_dir / TARGET_INFO_FILE  # the base's training record, for describe_target's readers
        if base_info.exists():
            (staging / TARGET_INFO_FILE).write_text(base_info.read_text())
        (staging / PADDING_FILE).write_text(json.dumps(record, indent=2) + "\n")

    return publish_directory(out, build)


def weight_bytes(directory: Path) -> int:
    """Bytes of the checkpoint's safetensors files (headers included): what a step has to read, near enough."""
    return sum(path.stat().st_size for path in Path(directory).glob("*.safetensors"))


def label(recipe: PaddedRecipe, directory: Path) -> str:
    """What a figure measured on the padded target is named by, wherever it appears."""
    return (
        f"{recipe.size}-v{recipe.version} padded to {weight_bytes(directory) / 1e6:.0f} MB "
        f"({recipe.num_layers} layers, {recipe.intermediate_size} MLP units), outputs identical up to float32 rounding"
    )
