"""Hidden states of a target LLM at chosen depths: what EAGLE drafters are trained on and fed with.

Layer id k is the residual stream after k decoder layers, i.e. the input of decoder layer k; k == L (the
number of layers) is the last layer's output before the final norm. This is what vLLM captures as an
auxiliary hidden state. States are taken in the model's own forward pass, with forward hooks on its decoder's
layers (`get_decoder().layers`, in every family transformers ships: Llama, Qwen2/3, Mistral) rather than with
`output_hidden_states`: that keeps every layer's state, L+1 of them, where a sync needs three, and its last entry is
post-norm in transformers 5.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch


@dataclass
class CapturedStates:
    """One forward pass of the target: aux [B,T,len(ids)*H], last [B,T,H] (pre-norm), logits [B,T,V].

    `final` [B,T,H] is `last` after the target's final norm: what its lm_head reads, and what vLLM hands
    EAGLE-1 and Medusa drafters as "the hidden state".
    """

    aux: torch.Tensor
    last: torch.Tensor
    final: torch.Tensor
    logits: torch.Tensor


def decoder_layers(model: Any) -> Any:
    """The decoder layers of a transformers causal LM, whatever its family calls the module that holds them."""
    return model.get_decoder().layers


def final_norm_of(model: Any) -> Any:
    """The norm after the last decoder layer: what turns the last state into what the lm_head reads."""
    return model.get_decoder().norm


def num_decoder_layers(model: Any) -> int:
    """The target's decoder layers: its config's count for a target loaded without them (`load_target_head`)."""
    return len(decoder_layers(model)) or int(model.config.num_hidden_layers)


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Three distinct ids (low, mid, high) in [0, num_layers]; vLLM's (2, L//2, L-3) when that is distinct."""
    if num_layers < 2:
        raise DraftsyncError(
            f"a target with {num_layers} decoder layer(s) has fewer than three distinct hidden-state depths",
            "use a target with at least 2 decoder layers for an EAGLE-3 drafter",
        )
    half = num_layers // 2
    for candidate in ((2, half, num_layers - 3), (1, half, num_layers - 1), (0, half, num_layers - 1)):
        if candidate[0] < candidate[1] < candidate[2] and candidate[0] >= 0:
            return candidate
    return (0, 1, 2)


def validate_aux_layer_ids(layer_ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    ids = tuple(int(k) for k in layer_ids)
    if len(set(ids)) != len(ids) or any(k < 0 or k > num_layers for k in ids):
        raise DraftsyncError(
            f"aux hidden-state layer ids {list(ids)} are not distinct ids in [0, {num_layers}]",
            f"pick distinct ids between 0 and {num_layers}, e.g. {list(default_aux_layer_ids(num_layers))}",
        )
    return ids


def cache_keyword(model: Any) -> str:
    """The forward keyword for the KV cache: `cache` in transformers 5.2x, `past_key_values` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def new_kv_cache(model: Any) -> Any:
    """A cache that keeps every position: a sliding-window one (Mistral) drops what falls out of the window and then
    cannot be cropped back after rejected drafts. The model's mask still applies the window."""
    from transformers import DynamicCache

    return DynamicCache()


def crop_kv_cache(cache: Any, tokens_to_remove: int) -> None:
    """Drop the last n cached positions; `crop(-n)` means that in every transformers version since 4.36."""
    if tokens_to_remove > 0:
        cache.crop(-tokens_to_remove)


def _layer_output(output: Any) -> torch.Tensor:
    # Decoder layers return a tensor in transformers 5 and a tuple before.
    return output[0] if isinstance(output, tuple) else output


def _layer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def capture(
    model: Any,
    input_ids: torch.Tensor,
    layer_ids: tuple[int, ...] | list[int],
    cache: Any = None,
    all_logits: bool = True,
) -> CapturedStates:
    """Run the target once and return its aux states at `layer_ids`, its last pre-norm state and its logits.

    With a `cache` (a transformers KV cache) only the new tokens in `input_ids` are run, at the positions
    that follow what the cache holds: the engine uses this to get the states of freshly verified tokens.
    `all_logits=False` computes logits for the last position only ([B,1,V]): a dataset build keeps the
    states and not the logits, which for a large vocabulary would dominate its memory.
    """
    import torch

    layers = decoder_layers(model)
    num_layers = len(layers)
    ids = validate_aux_layer_ids(layer_ids, num_layers)
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def keep_input(index: int):
        def hook(_module, args, kwargs):
            captured[index] = _layer_input(args, kwargs)

        return hook

    def keep_output(index: int):
        def hook(_module, _args, output):
            captured[index] = _layer_output(output)

        return hook

    wanted = set(ids) | {num_layers}
    try:
        if 0 in wanted:
            handles.append(layers[0].register_forward_pre_hook(keep_input(0), with_kwargs=True))
        for k in sorted(wanted - {0}):
            handles.append(layers[k - 1].register_forward_hook(keep_output(k)))
        kwargs: dict[str, Any] = {"input_ids": input_ids, "use_cache": cache is not None}
        if not all_logits:
            kwargs["logits_to_keep"] = 1
        if cache is not None:
            kwargs[cache_keyword(model)] = cache
        with torch.no_grad():
            out = model(**kwargs)
            final = final_norm_of(model)(captured[num_layers])
    finally:
        for handle in handles:
            handle.remove()
    aux = torch.cat([captured[k].to(final.device) for k in ids], dim=-1)  # a device_map spreads the layers
    return CapturedStates(aux=aux, last=captured[num_layers], final=final, logits=out.logits)
