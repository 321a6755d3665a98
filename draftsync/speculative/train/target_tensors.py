"""The target's tensors a training reads (its lm_head, the embedding an EAGLE-3 drafter keeps frozen), placed on the
training device without moving the target's own modules.

A target may live elsewhere: spread over GPUs by accelerate's device_map, whose hooks send each module's inputs to
where its weights were, or loaded once for a whole sync beside the training's GPU. So no parameter is shared across
modules on different devices: training shares a target's tensor only where it already lives on the training device
(a 128K x 8192 embedding is then held once) and holds a frozen copy there otherwise, and a trained drafter owns its
tensors before it leaves the training device, so moving it never moves a parameter of the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def training_head(target: Any, device: torch.device) -> Any:
    """The target's lm_head when it lives on `device`, else a frozen copy of it there (in the target's dtype)."""
    import torch

    head = target.get_output_embeddings()
    if on_device(head.weight, device):
        return head
    bias = getattr(head, "bias", None)
    copy = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=bias is not None, device="meta")
    copy.weight = _copy_of(head.weight, device)
    if bias is not None:
        copy.bias = _copy_of(bias, device)
    return copy.eval()


def placed_for_training(drafter: Any, target: Any, device: torch.device) -> Any:
    """`drafter` on `device`, sharing a tensor with `target` only where the target's lives on `device`."""
    _own_copies(drafter, target, device, keep_on=device)
    return drafter.to(device)


def released_from_target(drafter: Any, target: Any, device: torch.device) -> Any:
    """`drafter` on `device` with tensors of its own: whatever it shared with `target` copied, the target untouched."""
    _own_copies(drafter, target, device, keep_on=None)
    return drafter.to(device)


def on_device(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether `tensor` lives on `device` ("cuda" without an index: the current CUDA device)."""
    import torch

    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return tensor.device == device


def _own_copies(drafter: Any, target: Any, device: torch.device, keep_on: torch.device | None) -> None:
    """Each parameter `drafter` shares with `target` replaced by a copy on `device`, except those on `keep_on`."""
    targets = {id(parameter) for parameter in target.parameters()}
    for module in drafter.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            if id(parameter) in targets and (keep_on is None or not on_device(parameter, keep_on)):
                setattr(module, name, _copy_of(parameter, device, parameter.requires_grad))


def _copy_of(tensor: torch.Tensor, device: torch.device, requires_grad: bool = False) -> torch.nn.Parameter:
    import torch

    return torch.nn.Parameter(tensor.detach().to(device, copy=True), requires_grad=requires_grad)
