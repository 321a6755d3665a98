"""The built-in tiny targets: HF checkpoints of each built-in family, trained on local text from a recipe.

Recipes are hashed; a built checkpoint is cached under that hash, so reruns reuse it, and the ones draftsync ships
(shipped_targets) are copied rather than trained. Version 2 of a target is version 1 fine-tuned at a low rate on a
shifted mix (a high rate makes it forget the old tasks). Loading any target, built-in or not, is
`draftsync.speculative.targets`. The chat template (tokenizer.CHAT_TEMPLATE) is no part of a recipe: it trains
nothing, so changing it keeps every key, and a cached build made before it existed is given it when next asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from draftsync.errors import DraftsyncError
from draftsync.files import publish_directory
from draftsync.speculative.data import corpora
from draftsync.speculative.targets import TARGET_INFO_FILE


@dataclass(frozen=True)
class TargetRecipe:
    """Everything that determines a built-in target's weights."""

    task_mix: dict[str, float]
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 704
    vocab_size: int = 2048
    max_position_embeddings: int = 1024
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 400
    lr: float = 3e-3
    seed: int = 0
    parent: TargetRecipe | None = None  # fine-tune this recipe's checkpoint instead of starting fresh
    tokenizer_texts: int = 3000
    family: str = "llama"  # a key of FAMILY_SHAPES: the family's transformers class and distinguishing features
    precision: str = "auto"  # as a drafter's TrainConfig.precision; the key records what it resolved to

    def trains_in_bf16(self) -> bool:
        import torch

        from draftsync.speculative.machine import trains_in_bf16

        return trains_in_bf16(self.precision, torch.device("cpu"))

    def key(self) -> str:
        payload = dataclasses.asdict(self)
        payload["parent"] = self.parent.key() if self.parent else None
        payload["precision"] = "bf16" if self.trains_in_bf16() else "fp32"
        payload["family"] = FAMILY_SHAPES.get(self.family, self.family)  # its settings: a change rebuilds
        payload["corpus_version"] = corpora.CORPUS_VERSION
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class _Shape(TypedDict, total=False):
    """The TargetRecipe fields a size sets (the others keep their defaults)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    seq_len: int
    batch_size: int
    tokenizer_texts: int


# Sizes: "demo" learns enough in a few minutes on 2 cores; "test" is for the test suite's end-to-end run;
# "deep" is for benchmarks that need a drafter small relative to its target; "strong" is the test size
# trained ten times longer, for the acceptance benchmark: a target that has learned more than a model of
# a drafter's size can copy from the drafter's data alone, and whose greedy output loops less.
_TEST_SHAPE = _Shape(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    intermediate_size=352,
    vocab_size=1024,
    seq_len=96,
    batch_size=12,
    tokenizer_texts=1500,
)
_SIZES: dict[str, _Shape] = {
    "demo": _Shape(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=704, vocab_size=2048),
    "test": _TEST_SHAPE,
    # "deep": the test size with twice the layers, for the benchmark: one drafter layer is a smaller share.
    "deep": {**_TEST_SHAPE, "num_layers": 8},
    "strong": _TEST_SHAPE,  # its steps differ (_STEPS)
    # "strong-deep": "strong" with twice the layers, for the drafter-quality benchmark: EAGLE-3's low, middle and high
    # states are layers apart only on a target deep enough to hold them apart.
    "strong-deep": {**_TEST_SHAPE, "num_layers": 8},
}
_STEPS = {"demo": (300, 80), "test": (250, 100), "deep": (300, 100), "strong": (2500, 250), "strong-deep": (2500, 250)}


# The built-in families: each is its transformers class with the settings that set that family's checkpoints apart,
# on the size's shape (4 heads). Users' checkpoints are read from their config, never from this table.
FAMILY_SHAPES: dict[str, dict] = {
    # The shape every earlier built-in target had: full multi-head attention, untied embeddings, default rope.
    "llama": {"class": "LlamaConfig"},
    # Llama 3.2 1B/3B: grouped-query attention, tied embeddings, llama3 rope (scaled beyond 256 positions here).
    "llama3": {
        "class": "LlamaConfig",
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    },
    # Qwen 3 (0.6B-4B): q/k norms, a head_dim wider than hidden/heads, grouped-query attention, tied embeddings.
    "qwen3": {
        "class": "Qwen3Config",
        "num_key_value_heads": 2,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Qwen 2.5 (0.5B-3B): q/k/v biases, grouped-query attention, tied embeddings.
    "qwen2": {
        "class": "Qwen2Config",
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Xiaomi MiMo-7B: a Qwen 2 trunk (q/k/v biases, untied embeddings) that ships its own multi-token-prediction layer
    # (`model.mtp_layers.0.*`, its own safetensors file here), trained with the trunk; vLLM serves it with method mtp.
    # Its model_type stays qwen2, so transformers loads the trunk without the publisher's remote code.
    "mimo": {
        "class": "Qwen2Config",
        "num_key_value_heads": 2,
        "architectures": ["MiMoForCausalLM"],
        "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Mistral 7B v0.1: a sliding window (64 here, inside a training window, so it is exercised), grouped-query
    # attention, untied embeddings.
    "mistral": {
        "class": "MistralConfig",
        "num_key_value_heads": 2,
        "sliding_window": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Qwen3-30B-A3B: routed experts narrower than a dense MLP in every layer (decoder_sparse_step 1), their top-k
    # weights renormalised, q/k norms, a head_dim wider than hidden/heads, grouped-query attention, untied embeddings.
    # Each token runs 2 of 8 experts of half the dense width (with 4, the test-size target answered every held-out
    # code prompt with EOS at once: nothing to draft).
    "qwen3_moe": {
        "class": "Qwen3MoeConfig",
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 176,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # Mixtral 8x7B: each token runs 2 of its experts (4 here), each of the dense width; grouped-query attention,
    # untied embeddings, no sliding window.
    "mixtral": {
        "class": "MixtralConfig",
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # gpt-oss-20b: each token runs 2 of 8 experts (4 of 32 there), each as wide as the model, with a biased router
    # and clamped SwiGLU; attention sinks, q/k/v/o biases, a head_dim wider than hidden/heads, grouped-query
    # attention, a sliding window on every other layer (64 here, inside a training window, so it binds), yarn rope
    # (scaled beyond 256 positions here), untied embeddings.
    "gpt_oss": {
        "class": "GptOssConfig",
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 128,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 64,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 256,
        },
    },
}


def builtin_recipe(version: int, size: str = "demo", family: str = "llama") -> TargetRecipe:
    """v1: code + math. v2: v1 fine-tuned at a low rate on a mix that adds prose."""
    if size not in _SIZES:
        raise DraftsyncError(f"unknown target size {size!r}", f"use one of {', '.join(_SIZES)}")
    if family not in FAMILY_SHAPES:
        raise DraftsyncError(f"unknown built-in target family {family!r}", f"use one of {', '.join(FAMILY_SHAPES)}")
    v1_steps, v2_steps = _STEPS[size]
    # fp32 on every machine: a recipe whose key depended on the CPU's bf16 speed would miss the shipped targets.
    v1 = TargetRecipe(
        task_mix={"code": 0.5, "math": 0.5}, steps=v1_steps, family=family, precision="fp32", **_SIZES[size]
    )
    if version == 1:
        return v1
    if version == 2:
        return dataclasses.replace(
            v1, task_mix={"code": 0.25, "math": 0.25, "prose": 0.5}, steps=v2_steps, lr=1e-3, parent=v1
        )
    raise DraftsyncError(f"no built-in target version {version}", "built-in targets have versions 1 and 2")


def family_config(recipe: TargetRecipe, eos_token_id: int):
    """The transformers config of a fresh built-in target: the recipe's shape with its family's settings."""
    import transformers

    settings = dict(FAMILY_SHAPES[recipe.family])
    config_class = getattr(transformers, settings.pop("class"))
    return config_class(
        **{
            "vocab_size": recipe.vocab_size,
            "hidden_size": recipe.hidden_size,
            "intermediate_size": recipe.intermediate_size,
            "num_hidden_layers": recipe.num_layers,
            "num_attention_heads": recipe.num_heads,
            "num_key_value_heads": recipe.num_heads,
            "max_position_embeddings": recipe.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": eos_token_id,
            **settings,
        }
    )


def _tokenizer(recipe: TargetRecipe, cache_dir: Path):
    from transformers import PreTrainedTokenizerFast

    from draftsync.speculative.builtin.tokenizer import train_tokenizer, with_chat_template

    payload = f"{recipe.vocab_size}-{recipe.tokenizer_texts}-{corpora.CORPUS_VERSION}"
    key = hashlib.sha256(payload.encode()).hexdigest()[:12]
    out = cache_dir / f"tokenizer-{key}"
    if (out / "tokenizer.json").exists():  # one cached before the chat template existed gets it here
        return with_chat_template(PreTrainedTokenizerFast.from_pretrained(out))
    # The tokenizer sees all three tasks, so every version of a target shares it.
    per_task = recipe.tokenizer_texts // len(corpora.TASKS)
    texts = [t for _, t in corpora.mixed_texts({t: 1.0 for t in corpora.TASKS}, per_task * 3, seed=7)]

    def train(staging: Path) -> None:
        train_tokenizer(texts, recipe.vocab_size, staging)

    publish_directory(out, train)
    return with_chat_template(PreTrainedTokenizerFast.from_pretrained(out))


class TokenStreams:
    """Per-task token streams (documents joined by EOS) with seeded window sampling by task mix."""

    def __init__(
        self, tokenizer, task_mix: dict[str, float], split: str = "train", max_docs: int = 3000, seed: int = 0
    ):
        self.task_mix = {t: s for t, s in task_mix.items() if s > 0}
        self.streams = {}
        eos = tokenizer.eos_token_id
        rng = random.Random(seed)
        for task in self.task_mix:
            docs = corpora.documents(task, split, seed=seed)
            docs = rng.sample(docs, min(max_docs, len(docs)))
            ids: list[int] = []
            for enc in tokenizer([d.text for d in docs])["input_ids"]:
                ids.extend(enc)
                ids.append(eos)
            self.streams[task] = ids

    def batch(self, rng: random.Random, batch_size: int, seq_len: int):
        import torch

        tasks = sorted(self.task_mix)
        weights = [self.task_mix[t] for t in tasks]
        rows = []
        for _ in range(batch_size):
            stream = self.streams[rng.choices(tasks, weights)[0]]
            start = rng.randrange(0, len(stream) - seq_len - 1)
            rows.append(stream[start : start + seq_len + 1])
        return torch.tensor(rows, dtype=torch.long)


def _target_dir(recipe: TargetRecipe, cache_dir: Path) -> Path:
    """Where `recipe` is built; its info file is written last, so a dir without one is no build."""
    return Path(cache_dir) / f"target-{recipe.key()}"


def built_target_info(recipe: TargetRecipe, cache_dir: Path) -> dict | None:
    """What the cached build of `recipe` recorded (its training time and losses), or None when not built yet."""
    info = _target_dir(recipe, cache_dir) / TARGET_INFO_FILE
    return json.loads(info.read_text()) if info.exists() else None


def build_target(
    recipe: TargetRecipe,
    cache_dir: Path,
    on_progress: Callable[[int, int, float], None] | None = None,
    use_shipped: bool = True,
) -> Path:
    """Return the checkpoint dir for `recipe`: cached, else copied from the shipped targets (`use_shipped`), else
    trained (its parent too). A shipped copy whose files do not match their hashes is refused, not trained over.
    A cached build without the chat template (one made before it existed) is given it, weights untouched."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftsync.speculative.builtin.shipped_targets import copy_shipped, find_shipped
    from draftsync.speculative.builtin.tokenizer import write_chat_template

    cache_dir = Path(cache_dir)
    out = _target_dir(recipe, cache_dir)
    if (out / TARGET_INFO_FILE).exists():
        write_chat_template(out)
        return out
    shipped = find_shipped(recipe.key()) if use_shipped else None
    if shipped is not None:
        publish_directory(out, copy_shipped(shipped))
        write_chat_template(out)  # a no-op unless another process published an older copy first
        return out
    tokenizer = _tokenizer(recipe, cache_dir)
    torch.manual_seed(recipe.seed)
    parent_dir = None
    if recipe.parent is not None:
        parent_dir = build_target(recipe.parent, cache_dir, on_progress, use_shipped)
        model = AutoModelForCausalLM.from_pretrained(parent_dir, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(family_config(recipe, tokenizer.eos_token_id))
    streams = TokenStreams(tokenizer, recipe.task_mix, seed=recipe.seed)
    rng = random.Random(recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, recipe.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, recipe.steps - warmup)))

    head = _MtpTraining.for_recipe(recipe, model, parent_dir)
    if head is not None and head.trains:
        optimizer.add_param_group({"params": head.parameters()})
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    bf16 = recipe.trains_in_bf16()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    model.train()
    started = time.perf_counter()
    loss_value = float("nan")
    for step in range(recipe.steps):
        batch = streams.batch(rng, recipe.batch_size, recipe.seq_len)
        with autocast:
            loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
            if head is not None and head.trains:
                loss = loss + head.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss_value = loss.item()
        if on_progress:
            on_progress(step + 1, recipe.steps, loss_value)
    seconds = time.perf_counter() - started
    model.eval()
    val_loss = evaluate_loss(model, tokenizer, list(corpora.TASKS), recipe.seq_len)

    info = {
        "recipe_key": recipe.key(),
        "task_mix": recipe.task_mix,
        "parent_recipe_key": recipe.parent.key() if recipe.parent else None,
        "train_steps": recipe.steps,
        "train_precision": "bf16" if bf16 else "fp32",
        "train_seconds": round(seconds, 1),
        "train_tokens_per_s": round(recipe.steps * recipe.batch_size * recipe.seq_len / max(seconds, 1e-9)),
        "final_train_loss": round(loss_value, 4),
        "heldout_loss": {t: round(v, 4) for t, v in val_loss.items()},
    }

    if head is not None:
        info["mtp_heldout_agreement"] = head.heldout_agreement(tokenizer, recipe.seq_len)

    def save(staging: Path) -> None:
        model.save_pretrained(staging)
        if head is not None:
            head.save(staging)
        tokenizer.save_pretrained(staging)
        (staging / TARGET_INFO_FILE).write_text(json.dumps(info, indent=2))

    return publish_directory(out, save)


MTP_WEIGHTS_FILE = "mtp.safetensors"  # the head's tensors beside the trunk's model.safetensors, as vLLM reads both
MTP_LOSS_WEIGHT = 0.3  # MiMo weighs its MTP loss below the main one (0.3 in pretraining)


class _MtpTraining:
    """A built-in target's own MTP head: trained with a fresh trunk on the main loss plus MTP_LOSS_WEIGHT times its
    own (token t+2 from the trunk's pre-norm state at t and token t+1, gradients into the trunk too, as MiMo
    pretrains it); a fine-tuned version keeps its parent's head as it was, as a team's SFT leaves it."""

    def __init__(self, head, model, trains: bool, architectures: list[str]):
        self.head, self.model, self.trains, self.architectures = head, model, trains, architectures
        self.states = None
        norm = model.model.norm
        norm.register_forward_pre_hook(lambda module, args: setattr(self, "states", args[0]))

    @classmethod
    def for_recipe(cls, recipe: TargetRecipe, model, parent_dir: Path | None) -> _MtpTraining | None:
        if not FAMILY_SHAPES[recipe.family].get("num_nextn_predict_layers"):
            return None
        from draftsync.speculative.methods.mtp.checkpoint import read_shipped_mtp
        from draftsync.speculative.methods.mtp.model import new_mtp

        head = read_shipped_mtp(parent_dir) if parent_dir is not None else new_mtp(model.config)
        head.model.embed_tokens = model.model.embed_tokens  # the trunk's own, trained with it
        head.lm_head = model.lm_head
        return cls(head, model, parent_dir is None, FAMILY_SHAPES[recipe.family]["architectures"])

    def parameters(self):
        return list(self.head.layer.parameters())

    def loss(self, batch):
        """Cross-entropy of the head's prediction of token t+2 (the trunk's forward just ran on batch[:, :-1])."""
        import torch
        import torch.nn.functional as F

        ids = batch[:, :-1]
        positions = torch.arange(ids.shape[1] - 1)
        logits, _ = self.head(ids[:, 1:], self.states[:, :-1], positions)
        return MTP_LOSS_WEIGHT * F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 2:].flatten())

    def heldout_agreement(self, tokenizer, seq_len: int) -> float:
        """How often the head's top token is the trunk's own greedy token two ahead, on held-out text."""
        import torch

        streams = TokenStreams(tokenizer, {task: 1.0 for task in corpora.TASKS}, split="heldout", max_docs=200, seed=1)
        batch = streams.batch(random.Random(1), 8, seq_len)
        with torch.no_grad():
            target = self.model(input_ids=batch).logits.argmax(-1)
            states = self.states
            assert states is not None  # the trunk's forward pass has just set them
            logits, _ = self.head(batch[:, 1:], states[:, :-1], torch.arange(batch.shape[1] - 1))
        return round(float((logits.argmax(-1) == target[:, 1:]).float().mean()), 4)

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        layer = {f"model.mtp_layers.0.{k}": v.detach().contiguous() for k, v in self.head.layer.state_dict().items()}
        save_file(layer, directory / MTP_WEIGHTS_FILE, metadata={"format": "pt"})
        config = json.loads((directory / "config.json").read_text())  # save_pretrained names the trunk's class
        config["architectures"] = self.architectures
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def rebuild_shipped_targets(
    on_built: Callable[[str, Path], None] | None = None, root: Path | None = None
) -> list[Path]:
    """Train every shipped target from its recipe (never from a shipped copy or a cache) and ship it."""
    import tempfile

    from draftsync.speculative.builtin.shipped_targets import SHIPPED, ship, shipped_name

    written = []
    with tempfile.TemporaryDirectory(prefix="draftsync-rebuild-") as cache:
        for size, family, version in SHIPPED:
            recipe = builtin_recipe(version, size, family)
            name = shipped_name(size, family, version)
            written.append(ship(build_target(recipe, Path(cache), use_shipped=False), name, recipe.key(), root))
            if on_built:
                on_built(name, written[-1])
    return written


def evaluate_loss(model, tokenizer, tasks: list[str], seq_len: int, batches: int = 4) -> dict[str, float]:
    """Held-out next-token loss per task: how well the target knows each part of the traffic."""
    import torch

    out = {}
    for task in tasks:
        streams = TokenStreams(tokenizer, {task: 1.0}, split="heldout", max_docs=400, seed=1)
        rng = random.Random(1)
        with torch.no_grad():
            losses = [
                float(model(input_ids=(b := streams.batch(rng, 8, seq_len)), labels=b).loss) for _ in range(batches)
            ]
        out[task] = sum(losses) / len(losses)
    return out
