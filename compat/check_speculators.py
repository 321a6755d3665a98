"""Cross-check draftsync's EAGLE-3 drafters against the `speculators` package: its loader, its forward pass.

Runs in `.venv-compat` (CPU torch, speculators, a transformers it accepts) with the repository on
PYTHONPATH. It imports only `draftsync.speculative` modules that need torch, transformers and safetensors
(never Prefect, MLflow or the rest of draftsync), which is also why that package may import nothing else.

For each variant (eagle3, with and without norm_before_residual; eagle3.1 = fc_norm + norm_output; and the
flags `speculators train` uses by default, norm_before_residual + norm_before_fc + norm_output) it
1. saves a tiny random Llama target: speculators reads the verifier's config.json (layer count, for the
   aux layer ids) and its embed_tokens / lm_head / final norm (for its frozen verifier head),
2. builds an Eagle3Drafter with a reduced draft vocabulary, redraws every weight (norm gains away from 1,
   so a norm applied in the wrong place shows) and saves it with `save_eagle3` (bf16),
3. loads it with speculators' generic `SpeculatorModel.from_pretrained` (which must resolve
   `Eagle3DraftModel`) in float32, and with our `load_eagle3` in float32; checks the config flags and
   that every tensor of the file is the same on both sides,
4. runs both on the same inputs, for each attention implementation speculators offers
   (simple_flex_attention, its training default; sdpa; eager), and compares the logits,
5. saves speculators' model with its own `save_pretrained` (what `speculators train` writes) and checks
   that `load_eagle3` reads it back to the same logits;
then the same for the eagle3 and eagle3.1 drafters of each built-in target family (Llama 3, Qwen 3, Qwen 2.5,
Mistral: their rope, head_dim, GQA and tied embeddings, from the family's tiny random target); then checks the
commands draftsync renders for `speculators train` against the installed package
(compat/speculators_cli.py), including a real `speculators train --dry-run` on the tiny target.

Inputs, in the layout of speculators' `Eagle3DraftModel.forward` (one packed sequence, after its
`shift_batch`):
- hidden_states [1, T, 3H]: the verifier's aux states concatenated in eagle_aux_hidden_state_layer_ids
  order, row t = the states at target position t;
- input_ids [1, T]: row t = token t+1 (the EAGLE shift), target-vocabulary ids;
- document_ids [1, T]: zeros (a single document);
- position_ids [1, T]: 0..T-1, the positions draftsync and vLLM use (the target's); speculators' own
  default after shift_batch is 1..T, which RoPE makes equivalent (only position differences matter);
- verifier_last_hidden_states: not given, so the forward returns draft tokens and no loss; the logits
  are read with a forward hook on `lm_head`, one call per training-time-test step.
Two TTT steps are compared. Step 0 is the drafter's ordinary forward (what vLLM runs for the first draft
token). In step 1 speculators feeds row t the ground-truth token t+2 (teacher forcing) and the step-0
output state, while draftsync's `unroll` feeds its own step-0 prediction: the input ids are chosen
greedily from our drafter's own step-0 predictions so that both feed the same tokens, and rows 0..T-2 are
compared (speculators pads the last row).

Tolerance: both sides hold the same bf16-rounded weights in float32 and compute in float32, so they differ
only by the order of operations (about 1e-6 here); a different op (a missing norm, a residual taken
before instead of after a norm, a rotary mismatch) moves logits by 0.1 or more. A comparison passes when
max |logits_ours - logits_theirs| <= 1e-4 * max(1, max |logits_theirs|).

Prints one JSON object; exits 1 on any mismatch, 2 when speculators cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path

RELATIVE_TOLERANCE = 1e-4
ATTENTION_IMPLEMENTATIONS = ("simple_flex_attention", "sdpa", "eager")
VARIANTS = {
    "eagle3": {},  # draftsync's default: norm_before_residual
    "eagle3-residual-not-normed": {"norm_before_residual": False},  # the EAGLE-3 paper's layer
    "eagle3.1": {"fc_norm": True, "norm_output": True},
    "speculators-train-default": {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True},
}
FLAGS = (
    "fc_norm",
    "norm_output",
    "norm_before_fc",
    "norm_before_residual",
    "draft_vocab_size",
    "eagle_aux_hidden_state_layer_ids",
)
TARGET_FAMILIES = ("llama3", "qwen3", "qwen2", "mistral")
FAMILY_VARIANTS = ("eagle3", "eagle3.1")
VOCAB, DRAFT_VOCAB, HIDDEN, LAYERS, SEQ_LEN, TTT_STEPS = 384, 96, 64, 4, 128, 2  # flex attention: T a multiple of 128


def tiny_target(directory: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return model


def random_drafter(target_config, flags: dict, seed: int):
    """An Eagle3Drafter with every weight redrawn at a scale that gives logits of order one."""
    import torch
    from draftsync.speculative.data.draft_vocab import build_draft_vocab
    from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter

    generator = torch.Generator().manual_seed(seed)
    drafter = Eagle3Drafter(Eagle3Config.for_target(target_config, draft_vocab_size=DRAFT_VOCAB, **flags))
    counts = torch.randint(0, 1000, (VOCAB,), generator=generator)
    drafter.set_draft_vocab(*build_draft_vocab(counts, DRAFT_VOCAB))
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.dim() == 1:  # RMSNorm gains
                parameter.copy_(1.0 + 0.3 * noise)
            elif name == "embed_tokens.weight":
                parameter.copy_(noise)
            else:
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))
    return drafter.eval()


def load_speculators(directory: Path, attention: str):
    """speculators' own loader, as `speculators train --from-pretrained` calls it, in float32."""
    import torch
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(directory))
    config.transformer_layer_config._attn_implementation = attention  # never serialised; set as speculators does
    model = SpeculatorModel.from_pretrained(str(directory), config=config, dtype=torch.float32)
    return model.eval()


def speculators_logits(model, aux, input_ids, positions, ttt_steps: int):
    """Logits of each TTT step of speculators' forward (read from lm_head), [steps][1, T, Dv]."""
    import torch

    captured = []
    handle = model.lm_head.register_forward_hook(lambda _module, _inputs, output: captured.append(output.detach()))
    try:
        with torch.no_grad():
            model(
                hidden_states=aux,
                input_ids=input_ids,
                document_ids=torch.zeros_like(input_ids),
                position_ids=positions[None, :],
                ttt_steps=ttt_steps,
            )
    finally:
        handle.remove()
    return captured


def greedy_ids(drafter, aux, first_token: int):
    """ids with ids[t+1] = our drafter's step-0 top-1 at row t, so step 1's teacher forcing equals our chain."""
    import torch

    ids = torch.tensor([[first_token]])
    with torch.no_grad():
        hidden = drafter.fuse(aux)
        for length in range(1, aux.shape[1]):
            logits, _ = drafter(ids, hidden[:, :length], torch.arange(length))
            next_id = drafter.to_target_ids(logits[:, -1].argmax(-1))
            ids = torch.cat([ids, next_id[:, None]], dim=1)
    return ids


def max_diff(ours, theirs, rows: int | None = None) -> tuple[float, bool]:
    """(max |ours - theirs| over the first `rows` rows, within tolerance)."""
    ours = ours[:, :rows] if rows is not None else ours
    theirs = theirs[:, :rows] if rows is not None else theirs
    scale = max(1.0, float(theirs.abs().max()))
    diff = float((ours - theirs).abs().max())
    return diff, diff <= RELATIVE_TOLERANCE * scale


def tensors_agree(directory: Path, ours, theirs) -> dict:
    """Every tensor of the saved file, as each side holds it after loading."""
    from safetensors.torch import load_file

    saved = load_file(str(directory / "model.safetensors"))
    ours_state = ours.state_dict()
    theirs_state = theirs.state_dict()
    missing = sorted(name for name in saved if name not in theirs_state)
    differ = sorted(
        name
        for name in saved
        if name in theirs_state
        and not (
            saved[name].to(theirs_state[name].dtype).equal(theirs_state[name])
            and ours_state[name].to(theirs_state[name].dtype).equal(theirs_state[name])
        )
    )
    extra = sorted(name for name in theirs_state if name not in saved)
    return {
        "missing_in_speculators": missing,
        "different": differ,
        "speculators_only": extra,
        "ok": not missing and not differ,
    }


def family_target(family: str, directory: Path):
    """A tiny random target of a built-in family (draftsync.speculative.builtin.targets.FAMILY_SHAPES), on this script's
    shape: transformers' own class with the family's rope, head_dim, GQA and tied embeddings."""
    import dataclasses

    import torch
    import transformers
    from draftsync.speculative.builtin.targets import builtin_recipe, family_config

    recipe = dataclasses.replace(
        builtin_recipe(1, "test", family),
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        num_layers=LAYERS,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(family_config(recipe, eos_token_id=0)).eval()
    model.save_pretrained(directory)
    return model


def check_variant(name: str, flags: dict, target, target_dir: Path, work: Path, seed: int) -> dict:
    import torch
    from draftsync.speculative.methods.checkpoint_files import SavedFor
    from draftsync.speculative.methods.eagle3.checkpoint import load_eagle3, save_eagle3

    drafter = random_drafter(target.config, flags, seed)
    drafter_dir = save_eagle3(drafter, work / name, SavedFor(str(target_dir), (type(target).__name__,), 3))
    ours = load_eagle3(drafter_dir)
    result: dict = {"method": ours.method, "flags": flags}
    # speculators' draft layer attends over the whole sequence; a windowed target's drafter (Mistral: vLLM windows the
    # draft layer with the target's window, and so does draftsync) is compared where the window does not bind.
    rows = ours.config.sliding_window
    if rows is not None:
        result["compared_rows"] = f"the first {rows} (the target's sliding window)"

    generator = torch.Generator().manual_seed(seed + 1)
    aux = 2.0 * torch.randn(1, SEQ_LEN, 3 * HIDDEN, generator=generator)
    positions = torch.arange(SEQ_LEN)
    ids = greedy_ids(ours, aux, first_token=int(torch.randint(VOCAB, (), generator=generator)))
    with torch.no_grad():
        ours_steps = ours.unroll(ids, aux, TTT_STEPS)
        ours_step0, _ = ours(ids, ours.fuse(aux), positions)

    diffs: dict = {}
    within = []
    for attention in ATTENTION_IMPLEMENTATIONS:
        theirs = load_speculators(drafter_dir, attention)
        if attention == ATTENTION_IMPLEMENTATIONS[0]:
            config = theirs.config
            result["speculators_class"] = type(theirs).__name__
            result["speculators_config"] = {key: getattr(config, key) for key in FLAGS}
            result["speculators_modules"] = {
                "fc_norm": None if theirs.fc_norm is None else len(theirs.fc_norm),
                "input_norm": theirs.input_norm is not None,
            }
            result["config_ok"] = all(getattr(config, key) == getattr(ours.config, key) for key in FLAGS[:-1]) and (
                list(config.eagle_aux_hidden_state_layer_ids) == list(ours.config.aux_layer_ids)
            )
            result["tensors"] = tensors_agree(drafter_dir, ours, theirs)
        steps = speculators_logits(theirs, aux, ids, positions, TTT_STEPS)
        compared = {
            "forward": max_diff(ours_step0, steps[0], rows=rows),
            "ttt_step0": max_diff(ours_steps[0], steps[0], rows=rows),
            # At step 1 row t stands at position t + 1: the window binds from row `rows - 1` on.
            "ttt_step1": max_diff(ours_steps[1], steps[1], rows=SEQ_LEN - 1 if rows is None else rows - 1),
        }
        diffs[attention] = {step: diff for step, (diff, _) in compared.items()}
        within += [ok for _, ok in compared.values()]
    result["logit_scale"] = round(float(ours_step0.abs().max()), 3)
    result["max_abs_logit_diff"] = diffs

    # What `speculators train` writes, read back by draftsync.
    theirs = load_speculators(drafter_dir, "sdpa")
    resaved = work / f"{name}-resaved"
    theirs.save_pretrained(str(resaved))
    reloaded = load_eagle3(resaved)
    with torch.no_grad():
        reloaded_logits, _ = reloaded(ids, reloaded.fuse(aux), positions)
    diff, ok = max_diff(reloaded_logits, speculators_logits(theirs, aux, ids, positions, 1)[0], rows=rows)
    result["speculators_save_read_by_draftsync"] = {"max_abs_logit_diff": diff, "ok": ok}
    within.append(ok)
    result["ok"] = result["config_ok"] and result["tensors"]["ok"] and all(within)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--keep", type=Path, help="write the checkpoints here instead of a temporary directory")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    try:
        import speculators  # noqa: F401
        import torch
        import transformers
    except ImportError as error:
        print(json.dumps({"ok": False, "error": f"cannot import speculators ({error}); run `make compat`"}))
        return 2
    from importlib.metadata import version

    from compat.speculators_cli import check_rendered_commands
    from loguru import logger

    logger.remove()  # speculators logs every file it opens
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)

    results: dict = {
        "versions": {name: version(name) for name in ("speculators", "transformers", "torch")},
        "tolerance": f"max |diff| <= {RELATIVE_TOLERANCE} * max(1, max |logits|)",
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        target_dir = work / "target"
        target = tiny_target(target_dir)
        for index, (name, flags) in enumerate(VARIANTS.items()):
            results["variants"][name] = check_variant(name, flags, target, target_dir, work, seed=10 + index)
        # The built-in target families: their eagle3 and eagle3.1 drafters, each on its family's tiny target.
        for family in TARGET_FAMILIES:
            family_dir = work / f"target-{family}"
            family_model = family_target(family, family_dir)
            for index, name in enumerate(FAMILY_VARIANTS):
                results["variants"][f"{family}-{name}"] = check_variant(
                    f"{family}-{name}", VARIANTS[name], family_model, family_dir, work, seed=30 + index
                )
        results["rendered_commands"] = check_rendered_commands(work / "commands", target_dir, VOCAB)

    results["ok"] = all(v["ok"] for v in results["variants"].values()) and results["rendered_commands"]["ok"]
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
