"""The ground truth the reference engine and the drafters are checked against."""

from __future__ import annotations

from typing import Any


def greedy_reference(target: Any, prompt_ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding, a full forward pass per token and no cache: nothing of the engine under test."""
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            logits = target(input_ids=torch.tensor([ids])).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]
