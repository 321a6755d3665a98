"""Where a sync's target runs, and the one copy of it that a sync loads."""

from __future__ import annotations

import torch
from draftsync.speculative.placement import (
    TargetPlacement,
    drop_decoder_layers,
    from_pretrained_options,
    release_shared_targets,
    shared_target,
)
from draftsync.speculative.targets import target_fingerprint


def test_the_cpu_keeps_fp32_and_a_gpu_takes_the_checkpoints_16_bit_dtype():
    assert from_pretrained_options({"dtype": "bfloat16"}, TargetPlacement()) == {"dtype": torch.float32}
    one = from_pretrained_options({"torch_dtype": "float16"}, TargetPlacement(("cuda:1",)))
    assert one == {"dtype": torch.float16, "device_map": {"": "cuda:1"}}
    fp32_checkpoint = from_pretrained_options({"dtype": "float32"}, TargetPlacement(("cuda:0",)))
    assert fp32_checkpoint["dtype"] == torch.bfloat16
    spread = from_pretrained_options({}, TargetPlacement(("cuda:0", "cuda:3"), max_memory_gib=70.5))
    assert spread == {"dtype": torch.bfloat16, "device_map": "auto", "max_memory": {0: "70.5GiB", 3: "70.5GiB"}}


def test_a_sync_loads_its_target_once_and_releases_it(tmp_path):
    from tests.support.tiny_models import build_tiny_target

    target_dir = build_tiny_target(tmp_path / "target")
    try:
        first, tokenizer = shared_target(target_dir)
        again, _ = shared_target(target_dir)
        assert again is first and first.dtype == torch.float32
        release_shared_targets()
        assert shared_target(target_dir)[0] is not first  # loaded anew after the release
    finally:
        release_shared_targets()


def test_dropping_the_decoder_layers_keeps_the_fingerprint_the_dataset_was_built_from(tmp_path):
    from tests.support.tiny_models import build_tiny_target

    target_dir = build_tiny_target(tmp_path / "target")
    try:
        model, _ = shared_target(target_dir)
        before = target_fingerprint(model)
        drop_decoder_layers(model)
        assert len(model.get_decoder().layers) == 0 and model.get_output_embeddings() is not None
        assert target_fingerprint(model) == before
        assert shared_target(target_dir)[0] is not model  # the reduced copy is never handed out as the target
    finally:
        release_shared_targets()
